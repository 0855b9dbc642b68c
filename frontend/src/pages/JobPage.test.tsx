import { act, screen, waitFor } from "@testing-library/react";
import userEvent from "@testing-library/user-event";
import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";
import { FakeEventSource, member, mockApi, page } from "../test/mockApi";
import { JOB_KINDS } from "../test/jobKinds";
import { renderPage } from "../test/render";
import { JobPage } from "./JobPage";

const runningJob = {
  id: "job-1234567890",
  kind: "electra_pretrain",
  status: "running",
  progress: 0.1,
  step: 10,
  total_steps: 100,
  metrics: { "generator.mlm_loss": 3.2 },
  error: null,
  created_at: "2030-01-01T00:00:00Z",
  started_at: "2030-01-01T00:00:05Z",
  finished_at: null,
  placement: { generator: "alpha", discriminator: "beta" },
};

const storedSeries = {
  series: {
    "generator.mlm_loss": [
      [5, 4.0],
      [10, 3.2],
    ],
    "generator.bytes_to_discriminator": [[10, 2048]],
    "generator.bytes_to_discriminator_total": [[10, 9000]],
  },
};
let metrics: unknown = storedSeries;
let artifacts: unknown[] = [];

function routes(job: Record<string, unknown> = runningJob) {
  return {
    "GET /me": member,
    "GET /job-kinds": JOB_KINDS,
    "GET /jobs/*": () => job,
    "GET /jobs/job-1234567890/metrics": () => metrics,
    "GET /jobs/job-1234567890/artifacts": page(artifacts),
    "POST /jobs/job-1234567890/cancel": { id: "job-1234567890", status: "cancelled" },
  };
}

beforeEach(() => {
  metrics = storedSeries;
  artifacts = [];
  FakeEventSource.instances = [];
  vi.stubGlobal("EventSource", FakeEventSource);
});
afterEach(() => {
  vi.useRealTimers();
  vi.unstubAllGlobals();
});

function progressValue() {
  return screen.getByRole("progressbar", { name: "Job progress" }).getAttribute("aria-valuenow");
}

describe("JobPage", () => {
  it("opens the event stream with credentials, renders progress from an event and refetches the series", async () => {
    const fake = mockApi(routes());
    renderPage(<JobPage />, { path: "/jobs/job-1234567890", route: "/jobs/:id" });
    await screen.findByRole("progressbar", { name: "Job progress" });
    expect(progressValue()).toBe("10");
    await waitFor(() => expect(FakeEventSource.instances).toHaveLength(1));
    const es = FakeEventSource.latest();
    expect(es.url).toBe("/api/v1/jobs/job-1234567890/events");
    expect(es.withCredentials).toBe(true);
    expect(screen.getByRole("figure", { name: "Loss" })).toHaveTextContent("generator.mlm_loss 3.2 at step 10");
    const fetches = fake.find("GET", "/jobs/job-1234567890/metrics").length;

    // The metric values of a snapshot belong to the roles' own steps: the points come from /metrics.
    metrics = {
      series: {
        ...storedSeries.series,
        "generator.mlm_loss": [...storedSeries.series["generator.mlm_loss"], [43, 2.5]],
        "generator.tokens_per_s": [[43, 1200]],
        "generator.bytes_to_discriminator": [[43, 4096]],
      },
    };
    act(() =>
      es.emit(
        {
          id: "job-1234567890",
          status: "running",
          progress: 0.42,
          step: 42,
          total_steps: 100,
          metrics: { "generator.mlm_loss": 2.5, "generator.tokens_per_s": 1200, "generator.bytes_to_discriminator": 4096 },
          error: null,
          attempt: 1,
        },
        "status",
      ),
    );
    expect(progressValue()).toBe("42");
    expect(screen.getByText(/step 42 of 100/)).toBeInTheDocument();
    expect(screen.getByRole("table", { name: "Latest metric values" })).toHaveTextContent("generator.bytes_to_discriminator4.00 KiB");
    await waitFor(() => expect(screen.getByRole("figure", { name: "Loss" })).toHaveTextContent("generator.mlm_loss 2.5 at step 43"), { timeout: 3000 });
    expect(fake.find("GET", "/jobs/job-1234567890/metrics").length).toBe(fetches + 1);
    expect(screen.getByRole("figure", { name: "Throughput" })).toHaveTextContent("generator.tokens_per_s 1,200 at step 43");
    expect(screen.getByRole("figure", { name: "Bytes sent per direction" })).toHaveTextContent("generator.bytes_to_discriminator 4.00 KiB at step 43");
    expect(screen.getByRole("figure", { name: "Bytes sent per direction" })).not.toHaveTextContent("_total");
    expect(screen.getByText("Live")).toBeInTheDocument();
  });

  it("shows a waiting job's place in the queue and the grant that allows each cluster", async () => {
    const waitingJob = {
      ...runningJob,
      status: "queued",
      progress: 0,
      step: 0,
      started_at: null,
      config: {},
      waiting: { reason: "waiting: slots of beta held by 3 other jobs; position 2", position: 2, cluster: "beta", kind: "cluster_full" },
      residency: [
        { cluster: "alpha", roles: ["generator"], allowed: true, grants: [{ grant_id: "grant-abcdef1234", input: "text", dataset_id: "d1", clusters: ["alpha", "beta"] }] },
        { cluster: "beta", roles: ["discriminator"], allowed: true, grants: [{ grant_id: "grant-abcdef1234", input: "text", dataset_id: "d1", clusters: ["alpha", "beta"] }] },
      ],
    };
    mockApi(routes(waitingJob));
    renderPage(<JobPage />, { path: "/jobs/job-1234567890", route: "/jobs/:id" });
    expect(await screen.findByTestId("job-waiting")).toHaveTextContent(
      "In the queue, position 2 for beta. waiting: slots of beta held by 3 other jobs; position 2",
    );
    expect(await screen.findByTestId("residency-discriminator")).toHaveTextContent("Allowed by grant");
    expect(screen.getByTestId("residency-discriminator")).toHaveTextContent("(text: alpha, beta)");
  });

  it("accepts unnamed SSE messages too", async () => {
    mockApi(routes());
    renderPage(<JobPage />, { path: "/jobs/job-1234567890", route: "/jobs/:id" });
    await waitFor(() => expect(FakeEventSource.instances).toHaveLength(1));
    act(() => FakeEventSource.latest().emit({ progress: 0.75, step: 75 }));
    expect(progressValue()).toBe("75");
  });

  it("closes the stream when the job finishes", async () => {
    const fake = mockApi(routes());
    renderPage(<JobPage />, { path: "/jobs/job-1234567890", route: "/jobs/:id" });
    await waitFor(() => expect(FakeEventSource.instances).toHaveLength(1));
    const es = FakeEventSource.latest();
    act(() => es.emit({ status: "succeeded", progress: 1, step: 100 }));
    expect(es.closed).toBe(true);
    expect(screen.getByText("succeeded")).toBeInTheDocument();
    expect(screen.queryByRole("button", { name: "Cancel job" })).toBeNull();
    // the final state is fetched once more from the API
    await waitFor(() => expect(fake.find("GET", "/jobs/job-1234567890").length).toBeGreaterThanOrEqual(2));
  });

  it("falls back to polling every 2 s when the stream fails", async () => {
    vi.useFakeTimers({ shouldAdvanceTime: true });
    let job = { ...runningJob };
    const fake = mockApi({ ...routes(), "GET /jobs/*": () => job });
    renderPage(<JobPage />, { path: "/jobs/job-1234567890", route: "/jobs/:id" });
    await waitFor(() => expect(FakeEventSource.instances).toHaveLength(1));
    const es = FakeEventSource.latest();
    act(() => es.fail());
    expect(es.closed).toBe(true);
    expect(await screen.findByText(/refreshing every 2 s/)).toBeInTheDocument();
    const before = fake.find("GET", "/jobs/job-1234567890").length;
    job = { ...runningJob, progress: 0.6, step: 60 };
    await act(async () => {
      await vi.advanceTimersByTimeAsync(2100);
    });
    expect(fake.find("GET", "/jobs/job-1234567890").length).toBe(before + 1);
    await waitFor(() => expect(progressValue()).toBe("60"));
  });

  it("does not open a stream for a finished job and draws its stored series", async () => {
    mockApi(routes({ ...runningJob, status: "failed", error: "worker lost", finished_at: "2030-01-01T01:00:00Z" }));
    renderPage(<JobPage />, { path: "/jobs/job-1234567890", route: "/jobs/:id" });
    expect(await screen.findByText("worker lost")).toBeInTheDocument();
    expect(FakeEventSource.instances).toHaveLength(0);
    expect(screen.getByRole("figure", { name: "Loss" })).toHaveTextContent("generator.mlm_loss 3.2 at step 10");
    expect(screen.getByRole("figure", { name: "Bytes sent per direction" })).toHaveTextContent("2.00 KiB");
    expect(await screen.findByText("This job wrote no artifacts.")).toBeInTheDocument();
  });

  it("says which device each role needs, and why a worker without it failed the job", async () => {
    const error =
      "role discriminator needs a CUDA device, but the worker of cluster 'beta' that took it trains on CPU only: start that cluster's workers with `nebula worker --device cuda` on hosts that have one, or submit the job with device 'any'";
    mockApi(
      routes({ ...runningJob, status: "failed", error, finished_at: "2030-01-01T01:00:00Z", config: { preset: "tiny", device: "any", role_devices: { discriminator: "cuda" } } }),
    );
    renderPage(<JobPage />, { path: "/jobs/job-1234567890", route: "/jobs/:id" });
    expect(await screen.findByRole("alert")).toHaveTextContent(/discriminator needs a CUDA device.*--device cuda/);
    expect(screen.getByText("beta · needs CUDA")).toBeInTheDocument();
    expect(screen.getByText("alpha")).toBeInTheDocument(); // the generator needs no particular device
  });

  it("links a model artifact to its dataset page and shows a report's details", async () => {
    artifacts = [
      {
        id: "a1",
        name: "electra_pretrain-job-1234-discriminator.safetensors",
        kind: "model",
        dataset_id: "ds-model",
        size_bytes: 2721508,
        details: { role: "discriminator" },
        created_at: "2030-01-01T01:00:00Z",
      },
      {
        id: "a2",
        name: "report-generator.json",
        kind: "report",
        dataset_id: null,
        size_bytes: 277,
        details: { role: "generator", last_step: 6, final_metrics: { mlm_loss: 6.1 } },
        created_at: "2030-01-01T01:00:00Z",
      },
    ];
    mockApi(routes({ ...runningJob, status: "succeeded", progress: 1, step: 100, finished_at: "2030-01-01T01:00:00Z" }));
    renderPage(<JobPage />, { path: "/jobs/job-1234567890", route: "/jobs/:id" });
    const model = await screen.findByRole("link", { name: "electra_pretrain-job-1234-discriminator.safetensors" });
    expect(model).toHaveAttribute("href", "/datasets/ds-model");
    expect(screen.queryByRole("link", { name: "report-generator.json" })).toBeNull();
    expect(screen.getByText("Show report")).toBeInTheDocument();
    expect(screen.getByText(/"mlm_loss": 6.1/)).toBeInTheDocument();
  });

  it("cancels after confirmation", async () => {
    const fake = mockApi(routes());
    renderPage(<JobPage />, { path: "/jobs/job-1234567890", route: "/jobs/:id" });
    const user = userEvent.setup();
    await user.click(await screen.findByRole("button", { name: "Cancel job" }));
    expect(fake.find("POST", "/jobs/job-1234567890/cancel")).toHaveLength(0);
    await user.click(screen.getByRole("button", { name: "Yes, cancel the job" }));
    await waitFor(() => expect(fake.find("POST", "/jobs/job-1234567890/cancel")).toHaveLength(1));
    expect(await screen.findByText("Cancellation requested.")).toBeInTheDocument();
  });
});
