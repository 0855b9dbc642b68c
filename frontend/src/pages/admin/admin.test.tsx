import { act, screen, waitFor, within } from "@testing-library/react";
import userEvent from "@testing-library/user-event";
import { afterEach, describe, expect, it, vi } from "vitest";
import { admin, member, mockApi, page, reply } from "../../test/mockApi";
import { renderPage } from "../../test/render";
import { certificateState, ClustersPage, describeDevice, HEALTH_POLL_MS } from "./ClustersPage";
import { QuotasPage } from "./QuotasPage";
import { RunningJobsPage } from "./RunningJobsPage";
import { UsersPage } from "./UsersPage";

afterEach(() => vi.unstubAllGlobals());

describe("UsersPage", () => {
  it("creates a user and shows a duplicate as the API says", async () => {
    let n = 0;
    const fake = mockApi({
      "GET /me": admin,
      "GET /users": page([admin]),
      "POST /users": (c: { body: Record<string, string> }) =>
        ++n === 1 ? reply(201, { id: "u-new", status: "active", ...c.body }) : reply(409, { detail: "a user with that email exists" }),
    });
    renderPage(<UsersPage />, { path: "/admin/users", route: "/admin/users" });
    const user = userEvent.setup();
    const form = await screen.findByRole("form", { name: "Create user" });
    const fill = async () => {
      await user.type(within(form).getByLabelText("Email"), "bob@example.org");
      await user.type(within(form).getByLabelText("Display name"), "Bob");
      await user.selectOptions(within(form).getByLabelText("Role"), "auditor");
      await user.type(within(form).getByLabelText("Initial password"), "a long password 1");
      await user.click(within(form).getByRole("button", { name: "Create user" }));
    };
    await fill();
    expect(await screen.findByText("Created bob@example.org.")).toBeInTheDocument();
    expect(fake.find("POST", "/users")[0].body).toEqual({ email: "bob@example.org", display_name: "Bob", role: "auditor", password: "a long password 1" });
    expect(screen.getByRole("combobox", { name: "Role of bob@example.org" })).toHaveValue("auditor");
    await fill();
    expect(await screen.findByText("a user with that email exists")).toBeInTheDocument();
  });

  it("suspends, reactivates and changes the role; never offers it on oneself", async () => {
    const fake = mockApi({
      "GET /me": admin,
      "GET /users": page([admin, member]),
      "POST /users/u-member/suspend": { ...member, status: "suspended" },
      "POST /users/u-member/reactivate": { ...member, status: "active" },
      "PATCH /users/u-member": (c: { body: { role: string } }) => ({ ...member, ...c.body }),
    });
    renderPage(<UsersPage />, { path: "/admin/users", route: "/admin/users" });
    const user = userEvent.setup();
    await user.click(await screen.findByRole("button", { name: "Suspend mia@example.org" }));
    await user.click(screen.getByRole("button", { name: "Yes, suspend" }));
    expect(await screen.findByText(/is suspended; their sessions and tokens were revoked/)).toBeInTheDocument();
    await user.click(screen.getByRole("button", { name: "Reactivate mia@example.org" }));
    expect(await screen.findByText("mia@example.org is active again.")).toBeInTheDocument();
    await user.selectOptions(screen.getByRole("combobox", { name: "Role of mia@example.org" }), "admin");
    await waitFor(() => expect(fake.find("PATCH", "/users/u-member")[0]?.body).toEqual({ role: "admin" }));
    expect(screen.queryByRole("button", { name: "Suspend ada@example.org" })).toBeNull();
    expect(screen.queryByRole("button", { name: "Delete ada@example.org" })).toBeNull();
  });

  it("issues a reset link and shows it once, until dismissed", async () => {
    const url = "http://nebula.example/reset-password#token=secret-one";
    const fake = mockApi({
      "GET /me": admin,
      "GET /users": page([admin, member, { ...member, id: "u-gone", email: "sam@example.org", status: "suspended" }]),
      "POST /users/u-member/reset-link": reply(201, { url, expires_at: "2026-12-02T05:00:00Z" }),
    });
    renderPage(<UsersPage />, { path: "/admin/users", route: "/admin/users" });
    const user = userEvent.setup();
    await user.click(await screen.findByRole("button", { name: "Reset link for mia@example.org" }));
    const shown = await screen.findByRole("region", { name: "Password reset link for mia@example.org, shown once" });
    expect(within(shown).getByRole("textbox")).toHaveValue(url);
    expect(shown).toHaveTextContent(/works once, expires .* and will not be shown again/);
    expect(fake.find("POST", "/users/u-member/reset-link")).toHaveLength(1);
    // not offered on oneself (forgot password is for that) nor on a suspended account
    expect(screen.queryByRole("button", { name: "Reset link for ada@example.org" })).toBeNull();
    expect(screen.queryByRole("button", { name: "Reset link for sam@example.org" })).toBeNull();
    await user.click(screen.getByRole("button", { name: "Done" }));
    expect(screen.queryByRole("region", { name: /Password reset link/ })).toBeNull();
    expect(screen.queryByDisplayValue(url)).toBeNull();
    expect(fake.find("POST", "/users/u-member/reset-link")).toHaveLength(1);
  });

  it("shows the API's refusal of a reset link and no link", async () => {
    mockApi({
      "GET /me": admin,
      "GET /users": page([admin, member]),
      "POST /users/u-member/reset-link": reply(409, { detail: "the user is not active" }),
    });
    renderPage(<UsersPage />, { path: "/admin/users", route: "/admin/users" });
    const user = userEvent.setup();
    await user.click(await screen.findByRole("button", { name: "Reset link for mia@example.org" }));
    expect(await screen.findByText("the user is not active")).toBeInTheDocument();
    expect(screen.queryByRole("region", { name: /Password reset link/ })).toBeNull();
  });
});

describe("cluster health", () => {
  it("says when a cluster has no broker user, with the reason and the fix", async () => {
    mockApi({
      "GET /me": admin,
      "GET /clusters": page([
        {
          id: "c2", name: "beta", switch_host: "10.0.0.6", switch_port: 7443, switch_online: false, workers_online: 0, running_jobs: 0,
          broker_user: "missing", broker_problem: "rabbitmqctl list_users failed; run `nebula clusters broker-user beta` on the control plane",
        },
      ]),
      "GET /clusters/c2/certificates": page([]),
      "GET /clusters/c2/presence": page([]),
    });
    renderPage(<ClustersPage />, { path: "/admin/clusters", route: "/admin/clusters" });
    const health = await screen.findByLabelText("Health of beta");
    expect(within(health).getByText("no broker user")).toBeInTheDocument();
    expect(within(health).getByText(/nebula clusters broker-user beta/)).toBeInTheDocument();
  });

  it("shows each cluster's switch, workers and jobs, the processes, and follows changes live", async () => {
    vi.useFakeTimers({ shouldAdvanceTime: true });
    let workers = 2;
    const fake = mockApi({
      "GET /me": admin,
      "GET /clusters": () =>
        page([{ id: "c1", name: "alpha", switch_host: "10.0.0.5", switch_port: 7443, switch_online: true, workers_online: workers, running_jobs: 1 }]),
      "GET /clusters/c1/certificates": page([]),
      "GET /clusters/c1/presence": page([
        { kind: "worker", instance: "h1:alpha:10", version: "0.1.0", started_at: "2030-01-01T00:00:00Z", last_seen: "2030-01-01T00:00:05Z", running_roles: ["job-1/generator"] },
      ]),
      "POST /clusters/c1/worker-credentials": reply(201, { id: "w1", cluster_id: "c1", created_at: "2030-01-01T00:00:00Z", revoked_at: null, token: "nbw_secret" }),
    });
    renderPage(<ClustersPage />, { path: "/admin/clusters", route: "/admin/clusters" });
    const health = await screen.findByLabelText("Health of alpha");
    expect(within(health).getByText("switch online")).toBeInTheDocument();
    expect(within(health).getByText("2 workers online")).toBeInTheDocument();
    expect(within(health).getByText("1 running job")).toBeInTheDocument();
    expect(await screen.findByText("job-1/generator")).toBeInTheDocument();
    const user = userEvent.setup({ advanceTimers: vi.advanceTimersByTime });
    await user.click(screen.getByRole("button", { name: "New worker credential for alpha" }));
    expect(await screen.findByLabelText("Worker credential for alpha")).toHaveValue("nbw_secret");
    workers = 0; // a worker stops: the next poll shows it
    await act(() => vi.advanceTimersByTimeAsync(HEALTH_POLL_MS + 100));
    expect(await within(health).findByText("0 workers online")).toBeInTheDocument();
    expect(fake.find("GET", "/clusters").length).toBeGreaterThanOrEqual(2);
    vi.useRealTimers();
  });
});

describe("worker devices", () => {
  const h200 = { kind: "cuda" as const, name: "NVIDIA H200", count: 8, memory_bytes: 150_119_301_120, runtime: "12.8" };
  const epyc = { kind: "cpu" as const, name: "AMD EPYC 7763", count: 2, memory_bytes: null, runtime: "" };

  it("describes a CUDA worker and a CPU worker in a few words", () => {
    expect(describeDevice(h200)).toBe("8 × NVIDIA H200, 139.8 GiB each, CUDA 12.8");
    expect(describeDevice({ kind: "cuda", count: 1, memory_bytes: 85_899_345_920 })).toBe("1 × CUDA device, 80.0 GiB");
    expect(describeDevice(epyc)).toBe("CPU, 2 cores (AMD EPYC 7763)");
    expect(describeDevice({ kind: "cpu", count: 1 })).toBe("CPU, 1 core");
  });

  it("shows each cluster's worker devices and each worker's device in its processes", async () => {
    mockApi({
      "GET /me": admin,
      "GET /clusters": page([
        {
          id: "c1", name: "alpha", switch_host: "10.0.0.5", switch_port: 7443, switch_online: true, workers_online: 3, running_jobs: 0,
          worker_devices: [{ device: h200, workers: 2 }, { device: epyc, workers: 1 }],
        },
      ]),
      "GET /clusters/c1/certificates": page([]),
      "GET /clusters/c1/presence": page([
        { kind: "switch", instance: "gw:alpha:1", version: "0.1.0", started_at: "2030-01-01T00:00:00Z", last_seen: "2030-01-01T00:00:05Z", running_roles: [], device: null },
        { kind: "worker", instance: "gpu1:alpha:10", version: "0.1.0", started_at: "2030-01-01T00:00:00Z", last_seen: "2030-01-01T00:00:05Z", running_roles: [], device: h200 },
      ]),
    });
    renderPage(<ClustersPage />, { path: "/admin/clusters", route: "/admin/clusters" });
    const devices = await screen.findByTestId("devices-alpha");
    expect(within(devices).getByText("CUDA")).toBeInTheDocument();
    expect(within(devices).getByText(/2 workers: 8 × NVIDIA H200, 139.8 GiB each, CUDA 12.8/)).toBeInTheDocument();
    expect(within(devices).getByText("CPU only")).toBeInTheDocument();
    expect(within(devices).getByText(/1 worker: CPU, 2 cores \(AMD EPYC 7763\)/)).toBeInTheDocument();
    const processes = await screen.findByRole("table", { name: "Processes of alpha" });
    expect(within(processes).getByRole("columnheader", { name: "Device" })).toBeInTheDocument();
    expect(within(processes).getByText("8 × NVIDIA H200, 139.8 GiB each, CUDA 12.8")).toBeInTheDocument();
    const switchRow = within(processes).getByText("gw:alpha:1").closest("tr") as HTMLElement;
    expect(within(switchRow).getAllByRole("cell")[3]).toHaveTextContent("none"); // a switch has no device
  });
});

describe("RunningJobsPage", () => {
  it("lists every tenant's active jobs with owner and clusters, and says so when there are none", async () => {
    mockApi({
      "GET /me": admin,
      "GET /admin/jobs": page([
        { id: "0123456789abcdef", kind: "electra_pretrain", status: "running", owner_id: "u1", owner_email: "bob@example.org", workspace_id: "w", placement: { generator: "alpha", discriminator: "beta" }, progress: 0.5, step: 5, total_steps: 10, attempt: 2, created_at: "2030-01-01T00:00:00Z", started_at: "2030-01-01T00:00:01Z" },
      ]),
    });
    renderPage(<RunningJobsPage />, { path: "/admin/jobs", route: "/admin/jobs" });
    expect(await screen.findByText("bob@example.org")).toBeInTheDocument();
    expect(screen.getByText("generator on alpha, discriminator on beta")).toBeInTheDocument();
    expect(screen.getByText("attempt 2")).toBeInTheDocument();
  });

  it("shows an empty state", async () => {
    mockApi({ "GET /me": admin, "GET /admin/jobs": page([]) });
    renderPage(<RunningJobsPage />, { path: "/admin/jobs", route: "/admin/jobs" });
    expect(await screen.findByText("No job is queued or running.")).toBeInTheDocument();
  });
});

describe("ClustersPage", () => {
  it("shows an enrollment token once, certificates with expiry, and revokes with a reason", async () => {
    const fake = mockApi({
      "GET /me": admin,
      "GET /clusters": page([{ id: "c1", name: "alpha", switch_host: "10.0.0.5", switch_port: 7443 }]),
      "GET /clusters/c1/certificates": page([{ serial: "0a1b", not_after: "2099-01-01T00:00:00Z", revoked_at: null }]),
      "POST /clusters/c1/enrollment-tokens": reply(201, { token: "enroll-xyz", expires_at: "2030-01-01T01:00:00Z" }),
      "POST /certificates/0a1b/revoke": { serial: "0a1b", not_after: "2099-01-01T00:00:00Z", revoked_at: "2030-01-01T00:00:00Z" },
    });
    renderPage(<ClustersPage />, { path: "/admin/clusters", route: "/admin/clusters" });
    const user = userEvent.setup();
    await user.click(await screen.findByRole("button", { name: "New enrollment token for alpha" }));
    expect(await screen.findByLabelText("Enrollment token for alpha")).toHaveValue("enroll-xyz");
    expect(await screen.findByText(/valid, \d+ days left/)).toBeInTheDocument();
    await user.click(screen.getByRole("button", { name: "Revoke certificate 0a1b" }));
    await user.type(screen.getByLabelText("Reason"), "key compromise");
    await user.click(screen.getByRole("button", { name: "Confirm revoke" }));
    expect(await screen.findByText("revoked")).toBeInTheDocument();
    expect(fake.find("POST", "/certificates/0a1b/revoke")[0].body).toEqual({ reason: "key compromise" });
  });

  it("labels certificate states", () => {
    const now = new Date("2030-01-01T00:00:00Z");
    expect(certificateState({ serial: "1", not_after: "2029-12-31T00:00:00Z" }, now).status).toBe("expired");
    expect(certificateState({ serial: "1", not_after: "2030-01-10T00:00:00Z" }, now).text).toBe("expires in 9 days");
    expect(certificateState({ serial: "1", not_after: "2031-01-10T00:00:00Z", revoked_at: "x" }, now).status).toBe("revoked");
    // A 30-day certificate is flagged only in its last third, when the switch renews it.
    const issued = { serial: "2", not_before: "2029-12-31T00:00:00Z", not_after: "2030-01-30T00:00:00Z" };
    expect(certificateState(issued, now)).toEqual({ status: "valid", text: "valid, 29 days left" });
    expect(certificateState(issued, new Date("2030-01-22T00:00:00Z")).text).toBe("expires in 8 days");
  });
});

describe("QuotasPage", () => {
  it("changes a workspace's quota in GiB", async () => {
    const ws = { id: "w1", name: "personal", owner_id: member.id, storage_bytes_used: 0, storage_bytes_limit: 1024 ** 3, max_concurrent_jobs: 2 };
    const fake = mockApi({
      "GET /me": admin,
      "GET /users": page([member]),
      "GET /workspaces": page([ws]),
      "PATCH /workspaces/w1/quota": (c: { body: object }) => ({ ...ws, ...c.body }),
    });
    renderPage(<QuotasPage />, { path: "/admin/quotas", route: "/admin/quotas" });
    const user = userEvent.setup();
    const storage = await screen.findByLabelText("Storage limit of personal in GiB");
    expect(fake.find("GET", "/workspaces")[0].query.get("owner_id")).toBe("u-member");
    await user.clear(storage);
    await user.type(storage, "5");
    await user.clear(screen.getByLabelText("Maximum concurrent jobs of personal"));
    await user.type(screen.getByLabelText("Maximum concurrent jobs of personal"), "4");
    await user.click(screen.getByRole("button", { name: "Save" }));
    await waitFor(() => expect(fake.find("PATCH", "/workspaces/w1/quota")[0]?.body).toEqual({ storage_bytes_limit: 5 * 1024 ** 3, max_concurrent_jobs: 4 }));
    expect(await screen.findByText("Saved.")).toBeInTheDocument();
  });
});
