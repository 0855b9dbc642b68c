import { screen, waitFor, within } from "@testing-library/react";
import userEvent from "@testing-library/user-event";
import { afterEach, describe, expect, it, vi } from "vitest";
import { member, mockApi, page, reply } from "../test/mockApi";
import { renderPage } from "../test/render";
import { AccessPage, effectiveStatus, endOfDayIso } from "./AccessPage";
import { CatalogPage } from "./CatalogPage";

afterEach(() => vi.unstubAllGlobals());

const base = { dataset_id: "d1", requester_id: "u-bob", owner_id: member.id, purpose: "train a small ELECTRA", dataset_name: "wiki-fr", requester_email: "bob@example.org" };

describe("AccessPage", () => {
  it("approves an incoming request with an expiry date", async () => {
    const fake = mockApi({
      "GET /me": member,
      "GET /access-requests": page([{ ...base, id: "r1", status: "pending" }]),
      "POST /access-requests/r1/approve": (c: { body: { expires_at: string } }) => ({ ...base, id: "r1", status: "approved", expires_at: c.body.expires_at }),
    });
    renderPage(<AccessPage />, { path: "/access", route: "/access" });
    const user = userEvent.setup();
    const item = (await screen.findByText("wiki-fr")).closest("li")!;
    await user.type(within(item).getByLabelText("Access expires on (optional)"), "2031-06-30");
    await user.click(within(item).getByRole("button", { name: "Approve bob@example.org for wiki-fr" }));
    await waitFor(() => expect(within(item).getByText("approved")).toBeInTheDocument());
    const call = fake.find("POST", "/access-requests/r1/approve")[0];
    expect(fake.find("GET", "/access-requests")[0].query.get("direction")).toBe("incoming");
    expect(call.body).toEqual({ expires_at: endOfDayIso("2031-06-30"), clusters: "any" });
    expect(within(item).getByRole("button", { name: "Revoke bob@example.org for wiki-fr" })).toBeInTheDocument();
  });

  it("approves for the clusters chosen, the dataset's default preselected, and narrows later", async () => {
    const fake = mockApi({
      "GET /me": member,
      "GET /clusters": page([
        { id: "c1", name: "cluster-a", switch_host: "a", switch_port: 1 },
        { id: "c2", name: "cluster-b", switch_host: "b", switch_port: 1 },
      ]),
      "GET /access-requests": page([{ ...base, id: "r9", status: "pending", clusters: null, dataset_default_clusters: ["cluster-a"] }]),
      "POST /access-requests/r9/approve": (c: { body: { clusters: string[] } }) => ({ ...base, id: "r9", status: "approved", clusters: c.body.clusters }),
      "POST /access-requests/r9/narrow": (c: { body: { clusters: string[] } }) => ({ ...base, id: "r9", status: "approved", clusters: c.body.clusters }),
    });
    renderPage(<AccessPage />, { path: "/access", route: "/access" });
    const user = userEvent.setup();
    const item = (await screen.findByText("wiki-fr")).closest("li")!;
    expect(within(item).getByTestId("grant-clusters")).toHaveTextContent("Owner's default: cluster-a");
    const chooser = await within(item).findByRole("group", { name: "Clusters the data may go to" });
    await waitFor(() => expect(within(chooser).getByRole("checkbox", { name: "cluster-a" })).toBeChecked());
    expect(within(chooser).getByRole("checkbox", { name: "cluster-b" })).not.toBeChecked();
    await user.click(within(chooser).getByRole("checkbox", { name: "cluster-b" }));
    await user.click(within(item).getByRole("button", { name: "Approve bob@example.org for wiki-fr" }));
    await waitFor(() => expect(within(item).getByTestId("grant-clusters")).toHaveTextContent("May go to: cluster-a, cluster-b"));
    expect(fake.find("POST", "/access-requests/r9/approve")[0].body).toEqual({ clusters: ["cluster-a", "cluster-b"] });

    const narrowing = within(item).getByRole("group", { name: "Narrow to" });
    await user.click(within(narrowing).getByRole("checkbox", { name: "cluster-b" }));
    await user.click(within(item).getByRole("button", { name: "Narrow bob@example.org for wiki-fr" }));
    await waitFor(() => expect(within(item).getByTestId("grant-clusters")).toHaveTextContent("May go to: cluster-a"));
    expect(fake.find("POST", "/access-requests/r9/narrow")[0].body).toEqual({ clusters: ["cluster-a"] });
  });

  it("denies, and shows the API's message when a decision fails", async () => {
    mockApi({
      "GET /me": member,
      "GET /access-requests": page([{ ...base, id: "r2", status: "pending" }]),
      "POST /access-requests/r2/deny": () => ({ ...base, id: "r2", status: "denied" }),
    });
    renderPage(<AccessPage />, { path: "/access", route: "/access" });
    const user = userEvent.setup();
    await user.click(await screen.findByRole("button", { name: "Deny bob@example.org for wiki-fr" }));
    expect(await screen.findByText("denied")).toBeInTheDocument();
    expect(screen.queryByRole("button", { name: /Approve/ })).toBeNull();
  });

  it("shows a revoke that conflicts as the API says it", async () => {
    const fake = mockApi({
      "GET /me": member,
      "GET /access-requests": page([{ ...base, id: "r3", status: "approved", expires_at: "2099-01-01T00:00:00Z" }]),
      "POST /access-requests/r3/revoke": reply(409, { detail: "request is not approved" }),
    });
    renderPage(<AccessPage />, { path: "/access", route: "/access" });
    const user = userEvent.setup();
    await user.click(await screen.findByRole("button", { name: "Revoke bob@example.org for wiki-fr" }));
    await user.click(screen.getByRole("button", { name: /Yes, revoke/ }));
    expect(await screen.findByRole("alert")).toHaveTextContent("request is not approved");
    expect(fake.find("POST", "/access-requests/r3/revoke")).toHaveLength(1);
  });

  it("withdraws an outgoing request, and says what to do when there is none", async () => {
    const fake = mockApi({
      "GET /me": member,
      "GET /access-requests": (c: { query: URLSearchParams }) =>
        c.query.get("direction") === "outgoing" ? page([{ ...base, id: "r4", status: "pending", requester_id: member.id, owner_id: "u-x" }]) : page([]),
      "POST /access-requests/r4/withdraw": { ...base, id: "r4", status: "withdrawn" },
    });
    renderPage(<AccessPage />, { path: "/access", route: "/access" });
    const user = userEvent.setup();
    expect(await screen.findByText("No one has asked to use your datasets.")).toBeInTheDocument();
    await user.click(screen.getByRole("tab", { name: "My requests" }));
    await user.click(await screen.findByRole("button", { name: "Withdraw request for wiki-fr" }));
    expect(await screen.findByText("withdrawn")).toBeInTheDocument();
    expect(fake.find("POST", "/access-requests/r4/withdraw")).toHaveLength(1);
  });

  it("counts an approved grant past its expiry as expired", () => {
    const r = { ...base, id: "r", status: "approved" as const, expires_at: "2020-01-01T00:00:00Z" };
    expect(effectiveStatus(r)).toBe("expired");
    expect(effectiveStatus({ ...r, expires_at: null })).toBe("approved");
  });
});

describe("CatalogPage", () => {
  it("requests access with a purpose", async () => {
    const fake = mockApi({
      "GET /me": member,
      "GET /catalog": page([
        { id: "d9", name: "news-de-en", kind: "parallel", size_bytes: 4096, sha256: "ab".repeat(32), discoverable: true, owner_id: "u-x" },
        { id: "d8", name: "mine", kind: "text", size_bytes: 1, sha256: "cd".repeat(32), discoverable: true, owner_id: member.id },
      ]),
      "GET /access-requests": page([]),
      "POST /access-requests": (c: { body: { dataset_id: string; purpose: string } }) => ({ id: "r9", requester_id: member.id, owner_id: "u-x", status: "pending", ...c.body }),
    });
    renderPage(<CatalogPage />, { path: "/catalog", route: "/catalog" });
    const user = userEvent.setup();
    await user.click(await screen.findByRole("button", { name: "Request access to news-de-en" }));
    expect(screen.queryByRole("button", { name: "Request access to mine" })).toBeNull();
    await user.type(screen.getByLabelText("Purpose"), "fine-tune ABNet de-en");
    await user.click(screen.getByRole("button", { name: "Send request" }));
    expect(await screen.findByText(/Request sent for “news-de-en”/)).toBeInTheDocument();
    expect(fake.find("POST", "/access-requests")[0].body).toEqual({ dataset_id: "d9", purpose: "fine-tune ABNet de-en" });
    expect(screen.getByText("pending")).toBeInTheDocument();
  });

  it("says what to do when the catalog is empty", async () => {
    mockApi({ "GET /me": member, "GET /catalog": page([]), "GET /access-requests": page([]) });
    renderPage(<CatalogPage />, { path: "/catalog", route: "/catalog" });
    expect(await screen.findByText("The catalog is empty.")).toBeInTheDocument();
  });
});
