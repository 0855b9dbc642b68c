import { describe, expect, it } from "vitest";
import { formatMetric, groupSeries } from "../pages/JobPage";
import { applyEvent, flattenSeries } from "./live";
import { buildConfig, NO_ADVANCED } from "./specs";
import { kindSpec } from "../test/jobKinds";
import type { Job } from "../api/types";

describe("series", () => {
  it("reads the API's role.metric series as numbers and drops anything else", () => {
    expect(
      flattenSeries({
        series: {
          "discriminator.rtd_loss": [
            [1, 0.69],
            [2, 0.68],
          ],
          broken: "x" as unknown as [number, number][],
        },
      }),
    ).toEqual({ "discriminator.rtd_loss": [[1, 0.69], [2, 0.68]] });
  });

  it("sorts series into the loss, throughput and bytes charts; running totals stay off the charts", () => {
    const g = groupSeries({
      "generator.mlm_loss": [],
      "discriminator.rtd_loss": [],
      "decoder.loss": [],
      "generator.tokens_per_s": [],
      "generator.bytes_to_discriminator": [],
      "generator.bytes_to_discriminator_total": [],
      "discriminator.bytes_to_generator": [],
      "generator.bytes_per_token": [],
      "decoder.bleu": [],
    });
    expect(g.loss.map((s) => s.label)).toEqual(["decoder.loss", "discriminator.rtd_loss", "generator.mlm_loss"]);
    expect(g.bytes.map((s) => s.label)).toEqual(["discriminator.bytes_to_generator", "generator.bytes_to_discriminator"]);
    expect(g.throughput.map((s) => s.label)).toEqual(["generator.tokens_per_s"]);
    expect(g.other.map((s) => s.label)).toEqual(["decoder.bleu", "generator.bytes_per_token"]);
  });

  it("formats byte counts per direction as bytes and other metrics as numbers", () => {
    expect(formatMetric("encoder.bytes_to_decoder", 2048)).toBe("2.00 KiB");
    expect(formatMetric("generator.bytes_to_discriminator_total", 3034)).toBe("2.96 KiB");
    expect(formatMetric("generator.bytes_per_token", 1.0062)).toBe("1.01");
    expect(formatMetric("decoder.bleu", 12.345)).toBe("12.3");
  });

  it("merges an event into the job", () => {
    const job = { id: "j", status: "queued", progress: 0, step: 0, metrics: { "a.x": 1 } } as unknown as Job;
    const next = applyEvent(job, { status: "running", progress: 0.5, step: 5, metrics: { "b.y": 2 }, attempt: 1 })!;
    expect(next).toMatchObject({ status: "running", progress: 0.5, step: 5, metrics: { "a.x": 1, "b.y": 2 } });
    expect(job.status).toBe("queued");
  });
});

describe("buildConfig", () => {
  it("sends only the preset unless overrides are filled in", () => {
    expect(buildConfig(kindSpec("electra_pretrain"), "tiny", NO_ADVANCED)).toEqual({ preset: "tiny" });
    expect(buildConfig(kindSpec("abnet_finetune"), "tiny", NO_ADVANCED)).toEqual({ preset: "tiny" });
  });

  it("asks for a device only when one is chosen", () => {
    expect(buildConfig(kindSpec("electra_pretrain"), "tiny", { ...NO_ADVANCED, device: "cuda" })).toEqual({ preset: "tiny", device: "cuda" });
    expect(buildConfig(kindSpec("abnet_finetune"), "tiny", { ...NO_ADVANCED, device: "cpu" })).toEqual({ preset: "tiny", device: "cpu" });
    expect(buildConfig(kindSpec("abnet_finetune"), "tiny", { ...NO_ADVANCED, device: "" })).toEqual({ preset: "tiny" });
  });

  it("asks for a schedule only for ABNet and only when one is chosen", () => {
    expect(buildConfig(kindSpec("abnet_finetune"), "tiny", { ...NO_ADVANCED, schedule: "stale1" })).toEqual({ preset: "tiny", schedule: "stale1" });
    expect(buildConfig(kindSpec("abnet_finetune"), "tiny", { ...NO_ADVANCED, schedule: "" })).toEqual({ preset: "tiny" });
    expect(buildConfig(kindSpec("electra_pretrain"), "tiny", { ...NO_ADVANCED, schedule: "stale1" })).toEqual({ preset: "tiny" });
  });

  it("uses ElectraJobConfig's keys for ELECTRA", () => {
    const advanced = { ...NO_ADVANCED, steps: "6", batchSize: "8", ckptEvery: "3", seed: "7", nDiscriminators: "2", discriminatorReadsText: false, forwardCodec: "int8" };
    expect(buildConfig(kindSpec("electra_pretrain"), "paper", advanced)).toEqual({
      preset: "paper",
      seed: 7,
      steps: 6,
      batch_size: 8,
      ckpt_every: 3,
      n_discriminators: 2,
      discriminator_reads_text: false,
    });
  });

  it("uses AbnetJobConfig's keys for ABNet", () => {
    const advanced = {
      ...NO_ADVANCED,
      steps: "500",
      nDiscriminators: "3",
      forwardCodec: " fp16(lowrank(0.2,method=power)) ",
      backwardCodec: "none",
      compressFromStep: "100",
    };
    expect(buildConfig(kindSpec("abnet_finetune"), "paper", advanced)).toEqual({
      preset: "paper",
      steps: 500,
      forward_codec: "fp16(lowrank(0.2,method=power))",
      backward_codec: "none",
      compress_from_step: 100,
    });
  });
});
