import { render, screen, waitFor, within } from "@testing-library/react";
import userEvent from "@testing-library/user-event";
import { afterEach, describe, expect, it, vi } from "vitest";
import { whatEachClusterSees } from "../jobs/specs";
import { kindSpec } from "../test/jobKinds";
import { member, mockApi, page, reply } from "../test/mockApi";
import { renderPage } from "../test/render";
import { AccessPage } from "./AccessPage";
import { DatasetPage } from "./DatasetPage";
import { ClusterViews } from "./JobPage";
import { isUseOnly } from "./Releases";
import { WorkspacePage } from "./WorkspacePage";

afterEach(() => vi.unstubAllGlobals());

const model = {
  id: "m1",
  name: "electra.safetensors",
  kind: "model",
  size_bytes: 4096,
  sha256: "e".repeat(64),
  discoverable: false,
  owner_id: member.id,
  workspace_id: "w1",
  derived_from: ["t1", "t2"],
  derived_from_names: { t1: "mia-corpus" },
  derived_by_job_id: "job-1",
  release: "required",
};
const request = {
  id: "rr1",
  dataset_id: "m1",
  requester_id: "u-bob",
  purpose: "publish the model",
  status: "pending",
  dataset_name: "electra.safetensors",
  dataset_kind: "model",
  dataset_size_bytes: 4096,
  requester_display_name: "Bob",
  approvals: [{ owner_id: member.id, owner_display_name: "Mia", status: "pending", decided_at: null }],
  sources: [{ id: "t1", name: "mia-corpus", kind: "text", owner_id: member.id }],
};

describe("DatasetPage for a derived model", () => {
  it("shows its sources and state, offers no download, and asks for release", async () => {
    const fake = mockApi({
      "GET /me": member,
      "GET /datasets/m1": model,
      "POST /datasets/m1/release-requests": (c: { body: { purpose: string } }) => ({ ...request, requester_id: member.id, purpose: c.body.purpose }),
    });
    renderPage(<DatasetPage />, { path: "/datasets/m1", route: "/datasets/:id" });
    const user = userEvent.setup();
    const panel = (await screen.findByRole("heading", { name: "Derived data" })).closest("section")!;
    expect(within(panel).getByText("use-only")).toBeInTheDocument();
    expect(within(panel).getByRole("link", { name: "mia-corpus" })).toHaveAttribute("href", "/datasets/t1");
    expect(within(panel).getByRole("link", { name: "t2" })).toHaveAttribute("href", "/datasets/t2"); // no name known: its id
    expect(within(panel).getByRole("link", { name: "job-1" })).toHaveAttribute("href", "/jobs/job-1");
    expect(screen.queryByRole("link", { name: "Download" })).toBeNull();
    expect(screen.getByRole("switch", { name: "Discoverable in the catalog" })).toBeDisabled();
    await user.type(within(panel).getByLabelText("Why it should be released"), "publish the model");
    await user.click(within(panel).getByRole("button", { name: "Ask for release" }));
    expect(await within(panel).findByText("release pending")).toBeInTheDocument();
    expect(fake.find("POST", "/datasets/m1/release-requests")[0].body).toEqual({ purpose: "publish the model" });
    expect(within(panel).queryByRole("button", { name: "Ask for release" })).toBeNull();
  });

  it("offers the download once released", async () => {
    mockApi({ "GET /me": member, "GET /datasets/m1": { ...model, release: "released" } });
    renderPage(<DatasetPage />, { path: "/datasets/m1", route: "/datasets/:id" });
    expect(await screen.findByRole("link", { name: "Download" })).toBeInTheDocument();
    expect(screen.getByText("released")).toBeInTheDocument();
    expect(screen.queryByRole("button", { name: "Ask for release" })).toBeNull();
  });

  it("shows the API's refusal of a release request", async () => {
    mockApi({
      "GET /me": member,
      "GET /datasets/m1": model,
      "POST /datasets/m1/release-requests": reply(409, { detail: "a release request for this dataset is already pending" }),
    });
    renderPage(<DatasetPage />, { path: "/datasets/m1", route: "/datasets/:id" });
    const user = userEvent.setup();
    await user.type(await screen.findByLabelText("Why it should be released"), "again");
    await user.click(screen.getByRole("button", { name: "Ask for release" }));
    expect(await screen.findByRole("alert")).toHaveTextContent("already pending");
  });
});

describe("the workspace's dataset table", () => {
  it("marks a use-only model and keeps it out of the catalog", async () => {
    mockApi({
      "GET /me": member,
      "GET /workspaces/w1": { id: "w1", name: "lab", owner_id: member.id, storage_bytes_used: 0, storage_bytes_limit: 1024, max_concurrent_jobs: 2 },
      "GET /workspaces/w1/datasets": page([model, { ...model, id: "t2", name: "own.txt", kind: "text", derived_from: [], derived_by_job_id: null, release: "not_needed" }]),
    });
    renderPage(<WorkspacePage />, { path: "/workspaces/w1", route: "/workspaces/:ws" });
    expect(await screen.findByRole("switch", { name: "Discoverable: electra.safetensors" })).toBeDisabled();
    expect(screen.getByRole("switch", { name: "Discoverable: own.txt" })).not.toBeDisabled();
    expect(screen.getAllByText("use-only")).toHaveLength(1);
  });
});

describe("release requests on the access page", () => {
  it("lets the source owner approve", async () => {
    const fake = mockApi({
      "GET /me": member,
      "GET /release-requests": page([request]),
      "POST /release-requests/rr1/approve": { ...request, status: "approved", approvals: [{ ...request.approvals[0], status: "approved" }] },
    });
    renderPage(<AccessPage />, { path: "/access?tab=releases-incoming", route: "/access" });
    const user = userEvent.setup();
    const item = (await screen.findByText("electra.safetensors")).closest("li")!;
    expect(within(item).getByText("From Bob · model, 4.00 KiB")).toBeInTheDocument();
    expect(within(item).getByText(/mia-corpus/)).toBeInTheDocument();
    await user.click(within(item).getByRole("button", { name: "Approve the release of electra.safetensors" }));
    await waitFor(() => expect(within(item).getAllByText("approved")).toHaveLength(2));
    expect(fake.find("GET", "/release-requests")[0].query.get("direction")).toBe("incoming");
    expect(within(item).queryByRole("button", { name: /Approve/ })).toBeNull();
  });

  it("lets the source owner deny, and offers nothing to decide to the requester", async () => {
    const fake = mockApi({
      "GET /me": member,
      "GET /release-requests": (c: { query: URLSearchParams }) =>
        c.query.get("direction") === "incoming"
          ? page([request])
          : page([{ ...request, id: "rr2", requester_id: member.id, approvals: [{ owner_id: "u-x", owner_display_name: "Xena", status: "pending", decided_at: null }] }]),
      "POST /release-requests/rr1/deny": { ...request, status: "denied", approvals: [{ ...request.approvals[0], status: "denied" }] },
    });
    renderPage(<AccessPage />, { path: "/access?tab=releases-incoming", route: "/access" });
    const user = userEvent.setup();
    await user.click(await screen.findByRole("button", { name: "Deny the release of electra.safetensors" }));
    expect(await screen.findByText("Denied the release of electra.safetensors.")).toBeInTheDocument();
    expect(fake.find("POST", "/release-requests/rr1/deny")).toHaveLength(1);
    await user.click(screen.getByRole("tab", { name: "My release requests" }));
    expect(await screen.findByText(/Xena/)).toBeInTheDocument();
    expect(screen.queryByRole("button", { name: /release of/ })).toBeNull();
  });
});

describe("what each cluster sees", () => {
  it("says the discriminators' cluster can read the text in both ELECTRA modes", () => {
    expect(whatEachClusterSees(kindSpec("electra_pretrain")).discriminator).toMatch(/whole text/);
    expect(whatEachClusterSees(kindSpec("electra_pretrain"), { discriminator_reads_text: false }).discriminator).toMatch(/can read the text/);
    const abnet = whatEachClusterSees(kindSpec("abnet_finetune"));
    expect(abnet.encoder).toMatch(/Never a target sentence/);
    expect(abnet.decoder).toMatch(/Never the source text/);
  });

  it("shows it on the job page by role and cluster", () => {
    render(<ClusterViews job={{ config: {}, placement: { encoder: "cluster-a", decoder: "cluster-b" } }} spec={kindSpec("abnet_finetune")} />);
    expect(screen.getByText("encoder on cluster-a")).toBeInTheDocument();
    expect(screen.getByText("decoder on cluster-b")).toBeInTheDocument();
  });

  it("treats required and pending as use-only", () => {
    expect([isUseOnly({ release: "required" }), isUseOnly({ release: "pending" }), isUseOnly({ release: "released" })]).toEqual([true, true, false]);
  });
});
