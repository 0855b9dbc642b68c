import { describe, expect, it } from "vitest";
import { groupSeries } from "../pages/JobPage";
import { appendPoints, applyEvent, flattenSeries, flattenValues } from "./live";
import { buildConfig } from "./specs";
import type { Job } from "../api/types";

describe("series", () => {
  it("flattens per-direction series", () => {
    expect(flattenSeries({ series: { loss: [[1, 2]], bytes_sent: { a_to_b: [[1, 10]], b_to_a: [[1, 5]] } } })).toEqual({
      loss: [[1, 2]],
      "bytes_sent.a_to_b": [[1, 10]],
      "bytes_sent.b_to_a": [[1, 5]],
    });
  });

  it("appends event values by step, replacing a repeated step and ignoring older ones", () => {
    let s = appendPoints({}, 1, { loss: 3 });
    s = appendPoints(s, 2, { loss: 2.5, nested: { x: 1 }, label: "text" });
    s = appendPoints(s, 2, { loss: 2.4 });
    s = appendPoints(s, 1, { loss: 9 });
    expect(s).toEqual({ loss: [[1, 3], [2, 2.4]], "nested.x": [[2, 1]] });
    expect(appendPoints(s, undefined, { loss: 1 })).toBe(s);
    expect(flattenValues({ a: 1, b: "x", c: { d: 2 } })).toEqual({ a: 1, "c.d": 2 });
  });

  it("sorts series into the loss, throughput and bytes charts", () => {
    const g = groupSeries({ loss: [], "bytes_sent.a": [], throughput: [], tokens_per_s: [], lr: [] });
    expect(g.loss.map((s) => s.label)).toEqual(["loss"]);
    expect(g.bytes.map((s) => s.label)).toEqual(["bytes_sent.a"]);
    expect(g.throughput.map((s) => s.label)).toEqual(["throughput", "tokens_per_s"]);
    expect(g.other.map((s) => s.label)).toEqual(["lr"]);
  });

  it("merges an event into the job", () => {
    const job = { id: "j", status: "queued", progress: 0, step: 0, metrics: { a: 1 } } as unknown as Job;
    const next = applyEvent(job, { status: "running", progress: 0.5, step: 5, metrics: { b: 2 } })!;
    expect(next).toMatchObject({ status: "running", progress: 0.5, step: 5, metrics: { a: 1, b: 2 } });
    expect(job.status).toBe("queued");
  });
});

describe("buildConfig", () => {
  it("sends only the preset unless overrides are filled in", () => {
    expect(buildConfig("tiny", { steps: "", compression: "", svdKeepRatio: "", compressionStartStep: "" })).toEqual({ preset: "tiny" });
    expect(buildConfig("paper", { steps: "500", compression: "fp16_svd", svdKeepRatio: "0.25", compressionStartStep: "100" })).toEqual({
      preset: "paper",
      steps: 500,
      compression: "fp16_svd",
      svd_keep_ratio: 0.25,
      compression_start_step: 100,
    });
  });
});
