import { screen, waitFor } from "@testing-library/react";
import userEvent from "@testing-library/user-event";
import { afterEach, describe, expect, it, vi } from "vitest";
import { member, mockApi, page, reply } from "../test/mockApi";
import { JOB_KINDS } from "../test/jobKinds";
import { renderPage } from "../test/render";
import { NewJobPage } from "./NewJobPage";

afterEach(() => vi.unstubAllGlobals());

const ds = (id: string, name: string, kind: string) => ({ id, name, kind, size_bytes: 1024, sha256: "0".repeat(64), discoverable: false });

function routes() {
  return {
    "GET /me": member,
    "GET /job-kinds": JOB_KINDS,
    "GET /workspaces": page([{ id: "w1", name: "personal", owner_id: member.id, storage_bytes_used: 0, storage_bytes_limit: 1, max_concurrent_jobs: 2 }]),
    "GET /workspaces/w1/datasets": page([ds("d-text", "wiki", "text"), ds("d-par", "news", "parallel"), ds("d-src", "bert-de", "model")]),
    "GET /access-requests": page([
      { id: "r1", dataset_id: "d-granted", requester_id: member.id, owner_id: "u-x", purpose: "p", status: "approved", expires_at: "2099-01-01T00:00:00Z" },
      { id: "r2", dataset_id: "d-old", requester_id: member.id, owner_id: "u-x", purpose: "p", status: "approved", expires_at: "2000-01-01T00:00:00Z" },
    ]),
    "GET /datasets/d-granted": ds("d-granted", "gpt-en (granted)", "model"),
    "GET /datasets/d-old": ds("d-old", "expired one", "model"),
    "GET /clusters": page([
      { id: "c1", name: "alpha", switch_host: "a", switch_port: 1 },
      { id: "c2", name: "beta", switch_host: "b", switch_port: 2 },
    ]),
    "POST /workspaces/w1/jobs": reply(202, { id: "job-9", status: "queued" }),
  };
}

describe("NewJobPage", () => {
  it("submits an ELECTRA job with the chosen input and roles on two clusters", async () => {
    const fake = mockApi(routes());
    renderPage(<NewJobPage />, { path: "/jobs/new?ws=w1", route: "/jobs/new" });
    const user = userEvent.setup();
    const input = await screen.findByLabelText(/Text corpus/);
    await user.selectOptions(input, "d-text");
    expect(screen.getByLabelText("Generator runs on")).toHaveValue("alpha");
    expect(screen.getByLabelText("Discriminator runs on")).toHaveValue("beta");
    await user.click(screen.getByText("Advanced options"));
    // a blank field shows the preset's value, as the server's table states it
    expect(screen.getByLabelText("Training steps")).toHaveAttribute("placeholder", "600");
    await user.type(screen.getByLabelText("Training steps"), "6");
    expect(screen.queryByLabelText(/Activations codec/)).toBeNull();
    expect(screen.queryByLabelText("Schedule")).toBeNull();
    await user.click(screen.getByRole("button", { name: "Submit job" }));
    await waitFor(() => expect(fake.find("POST", "/workspaces/w1/jobs")).toHaveLength(1));
    expect(fake.find("POST", "/workspaces/w1/jobs")[0].body).toEqual({
      kind: "electra_pretrain",
      config: { preset: "tiny", steps: 6 },
      inputs: { text: "d-text" },
      placement: { generator: "alpha", discriminator: "beta" },
    });
  });

  it("asks for CUDA when chosen, and says which clusters have CUDA workers online", async () => {
    const h200 = { kind: "cuda", name: "NVIDIA H200", count: 1, memory_bytes: null, runtime: "12.8" };
    const fake = mockApi({
      ...routes(),
      "GET /clusters": page([
        { id: "c1", name: "alpha", switch_host: "a", switch_port: 1, worker_devices: [{ device: { kind: "cpu", count: 2 }, workers: 1 }] },
        { id: "c2", name: "beta", switch_host: "b", switch_port: 2, worker_devices: [{ device: h200, workers: 1 }] },
      ]),
    });
    renderPage(<NewJobPage />, { path: "/jobs/new?ws=w1", route: "/jobs/new" });
    const user = userEvent.setup();
    await user.selectOptions(await screen.findByLabelText(/Text corpus/), "d-text");
    await user.click(screen.getByText("Advanced options"));
    expect(screen.getByText(/CUDA workers are online on beta\./)).toBeInTheDocument();
    await user.selectOptions(screen.getByLabelText("Device"), "cuda");
    await user.click(screen.getByRole("button", { name: "Submit job" }));
    await waitFor(() => expect(fake.find("POST", "/workspaces/w1/jobs")).toHaveLength(1));
    expect(fake.find("POST", "/workspaces/w1/jobs")[0].body).toMatchObject({ config: { preset: "tiny", device: "cuda" } });
  });

  it("greys out a cluster the chosen input's grant does not allow, and says which grant", async () => {
    mockApi({
      ...routes(),
      "GET /access-requests": page([
        { id: "r3", dataset_id: "d-alice", requester_id: member.id, owner_id: "u-x", purpose: "p", status: "approved", expires_at: null, clusters: ["alpha"] },
      ]),
      "GET /datasets/d-alice": { ...ds("d-alice", "alice-text", "text"), allowed_clusters: ["alpha"] },
    });
    renderPage(<NewJobPage />, { path: "/jobs/new?ws=w1", route: "/jobs/new" });
    const user = userEvent.setup();
    const input = await screen.findByLabelText(/Text corpus/);
    await waitFor(() => expect(screen.getByRole("option", { name: "alice-text" })).toBeInTheDocument());
    await user.selectOptions(input, "d-alice");
    const beta = screen.getAllByRole("option", { name: "beta (not allowed for alice-text)" });
    expect(beta).toHaveLength(2); // one per role's select
    beta.forEach((option) => expect(option).toBeDisabled());
    expect(screen.getAllByRole("option", { name: "alpha" })[0]).not.toBeDisabled();
    expect(screen.getByTestId("greyed-clusters")).toHaveTextContent("beta, which the grant behind “alice-text” does not allow (it allows alpha)");
    // the user's own text goes anywhere
    await user.selectOptions(input, "d-text");
    expect(screen.queryByTestId("greyed-clusters")).toBeNull();
  });

  it("offers own and granted datasets of the right kind for ABNet, not expired grants", async () => {
    const fake = mockApi(routes());
    renderPage(<NewJobPage />, { path: "/jobs/new", route: "/jobs/new" });
    const user = userEvent.setup();
    await user.click(await screen.findByRole("radio", { name: /ABNet fine-tuning/ }));
    await user.click(screen.getByRole("radio", { name: /paper/ }));
    const target = screen.getByLabelText(/Target model/);
    const options = Array.from(target.querySelectorAll("option")).map((o) => o.textContent);
    expect(options.some((o) => o?.includes("gpt-en (granted)"))).toBe(true);
    expect(options.some((o) => o?.includes("expired one"))).toBe(false);
    expect(options.some((o) => o?.includes("wiki"))).toBe(false);
    expect(screen.getByRole("button", { name: "Submit job" })).toBeDisabled();
    await user.selectOptions(screen.getByLabelText(/Parallel corpus/), "d-par");
    await user.selectOptions(screen.getByLabelText(/Source model/), "d-src");
    await user.selectOptions(target, "d-granted");
    await user.selectOptions(screen.getByLabelText("Decoder runs on"), "alpha");
    expect(screen.getByText(/must run on different clusters/)).toBeInTheDocument();
    await user.selectOptions(screen.getByLabelText("Decoder runs on"), "beta");
    expect(screen.getByLabelText(/Evaluation split/)).not.toBeRequired();
    await user.click(screen.getByText("Advanced options"));
    expect(screen.queryByLabelText("Discriminators")).toBeNull();
    expect(screen.getByLabelText("Training steps")).toHaveAttribute("placeholder", "100000");
    expect(screen.getByLabelText(/Activations codec/)).toHaveAttribute("placeholder", "fp16");
    expect(screen.getByText(/Evaluation \(BLEU\) sends its activations through the activations codec/)).toBeInTheDocument();
    await user.type(screen.getByLabelText(/Activations codec/), "fp16(lowrank(0.2,method=power))");
    await user.type(screen.getByLabelText(/Gradients codec/), "none");
    await user.type(screen.getByLabelText("Compress from step"), "10");
    await user.selectOptions(screen.getByLabelText("Schedule"), "stale1");
    await user.click(screen.getByRole("button", { name: "Submit job" }));
    await waitFor(() => expect(fake.find("POST", "/workspaces/w1/jobs")).toHaveLength(1));
    expect(fake.find("POST", "/workspaces/w1/jobs")[0].body).toEqual({
      kind: "abnet_finetune",
      config: { preset: "paper", forward_codec: "fp16(lowrank(0.2,method=power))", backward_codec: "none", compress_from_step: 10, schedule: "stale1" },
      inputs: { parallel: "d-par", source_model: "d-src", target_model: "d-granted" },
      placement: { encoder: "alpha", decoder: "beta" },
    });
  }, 15_000); // types two codec specs key by key: slow on a loaded machine

  it("sends the optional evaluation split when one is chosen", async () => {
    const fake = mockApi(routes());
    renderPage(<NewJobPage />, { path: "/jobs/new?ws=w1", route: "/jobs/new" });
    const user = userEvent.setup();
    await user.click(await screen.findByRole("radio", { name: /ABNet fine-tuning/ }));
    await user.selectOptions(screen.getByLabelText(/Parallel corpus/), "d-par");
    await user.selectOptions(screen.getByLabelText(/Source model/), "d-src");
    await user.selectOptions(screen.getByLabelText(/Target model/), "d-granted");
    await user.selectOptions(screen.getByLabelText(/Evaluation split/), "d-par");
    await user.click(screen.getByRole("button", { name: "Submit job" }));
    await waitFor(() => expect(fake.find("POST", "/workspaces/w1/jobs")).toHaveLength(1));
    expect(fake.find("POST", "/workspaces/w1/jobs")[0].body).toMatchObject({
      inputs: { parallel: "d-par", source_model: "d-src", target_model: "d-granted", eval: "d-par" },
    });
  });

  it("shows the API's refusal (no active grant)", async () => {
    mockApi({ ...routes(), "POST /workspaces/w1/jobs": reply(403, { detail: "no active grant on dataset d-text" }) });
    renderPage(<NewJobPage />, { path: "/jobs/new?ws=w1", route: "/jobs/new" });
    const user = userEvent.setup();
    await user.selectOptions(await screen.findByLabelText(/Text corpus/), "d-text");
    await user.click(screen.getByRole("button", { name: "Submit job" }));
    expect(await screen.findByRole("alert")).toHaveTextContent("no active grant on dataset d-text");
  });
});
