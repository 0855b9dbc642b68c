import { screen, waitFor, within } from "@testing-library/react";
import userEvent from "@testing-library/user-event";
import { afterEach, describe, expect, it, vi } from "vitest";
import { auditor, mockApi, page } from "../test/mockApi";
import { renderPage } from "../test/render";
import { AuditPage } from "./AuditPage";

afterEach(() => vi.unstubAllGlobals());

const event = {
  id: "e1",
  seq: 7,
  at: "2030-01-01T00:00:00Z",
  actor_id: "u-admin-123456",
  action: "user.suspend",
  subject_type: "user",
  subject_id: "u-bob",
  outcome: "success",
  ip: "10.0.0.1",
  details: { reason: "left" },
  hash: "h7",
  prev_hash: "h6",
  actor: { email: "ada@example.org", display_name: "Ada Admin" },
  subject_name: "Bob Builder",
  subject_email: "bob@example.org",
};

const upload = {
  ...event,
  id: "e2",
  seq: 8,
  actor_id: "u-bob",
  action: "dataset.upload",
  subject_type: "dataset",
  subject_id: "d-corpus-42",
  actor: { email: "bob@example.org", display_name: "Bob Builder" },
  subject_name: "spanish-corpus",
  subject_email: null,
};

const anonymous = { ...event, id: "e3", seq: 9, actor_id: null, actor: null, action: "auth.login", subject_type: "email", subject_id: "x@example.org", subject_name: null, subject_email: null, outcome: "failure" };

describe("AuditPage", () => {
  it("shows an intact chain, the events and export links", async () => {
    mockApi({ "GET /me": auditor, "GET /audit/verify": { ok: true, count: 7, first_bad_seq: null }, "GET /audit": page([event]) });
    renderPage(<AuditPage />, { path: "/audit", route: "/audit" });
    expect(await screen.findByText(/Chain intact · 7 events/)).toBeInTheDocument();
    expect(await screen.findByText("user.suspend")).toBeInTheDocument();
    expect(screen.getByRole("link", { name: "Export the whole log as CSV" })).toHaveAttribute("href", "/api/v1/audit/export?format=csv");
    expect(screen.getByRole("link", { name: "Export the whole log as JSON lines" })).toHaveAttribute("href", "/api/v1/audit/export?format=jsonl");
    // read-only: nothing to change
    expect(screen.queryByRole("button", { name: /delete|edit/i })).toBeNull();
  });

  it("names the actor and the subject beside their ids", async () => {
    mockApi({ "GET /me": auditor, "GET /audit/verify": { ok: true, count: 9, first_bad_seq: null }, "GET /audit": page([event, upload, anonymous]) });
    renderPage(<AuditPage />, { path: "/audit", route: "/audit" });
    const rows = await screen.findAllByRole("row");
    const [suspend, uploaded, login] = rows.slice(1);
    // the person's display name and email, then the id that filters by them
    expect(within(suspend).getAllByRole("cell")[2]).toHaveTextContent("Ada Admin ada@example.org u-admin-");
    expect(within(suspend).getByRole("button", { name: "Filter by actor ada@example.org u-admin-123456" })).toBeInTheDocument();
    expect(within(suspend).getAllByRole("cell")[4]).toHaveTextContent("user Bob Builder bob@example.org u-bob");
    expect(within(uploaded).getAllByRole("cell")[4]).toHaveTextContent("dataset spanish-corpus d-corpus");
    expect(within(uploaded).getAllByRole("cell")[2]).toHaveTextContent("Bob Builder bob@example.org u-bob");
    // no person behind the event, and a subject that names nothing: the bare id
    expect(within(login).getAllByRole("cell")[2]).toHaveTextContent("—");
    expect(within(login).queryByRole("button", { name: /Filter by actor/ })).toBeNull();
    expect(within(login).getAllByRole("cell")[4]).toHaveTextContent("email x@exampl");
  });

  it("shows where the chain breaks", async () => {
    mockApi({ "GET /me": auditor, "GET /audit/verify": { ok: false, count: 9, first_bad_seq: 4 }, "GET /audit": page([]) });
    renderPage(<AuditPage />, { path: "/audit", route: "/audit" });
    expect(await screen.findByText(/Chain broken at event #4/)).toBeInTheDocument();
  });

  it("names what verification found", async () => {
    const problems = [{ kind: "tail_deleted", first_seq: 7, last_seq: 9, detail: "tail_deleted: events 7..9 missing from the end" }];
    mockApi({ "GET /me": auditor, "GET /audit/verify": { ok: false, count: 6, first_bad_seq: 7, anchored_seq: 9, problems }, "GET /audit": page([]) });
    renderPage(<AuditPage />, { path: "/audit", route: "/audit" });
    expect(await screen.findByText("tail_deleted: events 7..9 missing from the end")).toBeInTheDocument();
  });

  it("filters by actor, action, outcome and time", async () => {
    const fake = mockApi({ "GET /me": auditor, "GET /audit/verify": { ok: true, count: 1, first_bad_seq: null }, "GET /audit": page([event]) });
    renderPage(<AuditPage />, { path: "/audit", route: "/audit" });
    const user = userEvent.setup();
    await user.type(await screen.findByLabelText("Actor (user id)"), "u-admin");
    await user.type(screen.getByLabelText("Action"), "auth.login");
    await user.selectOptions(screen.getByLabelText("Outcome"), "failure");
    await user.type(screen.getByLabelText("From"), "2030-01-01T10:00");
    await user.click(screen.getByRole("button", { name: "Apply filters" }));
    await waitFor(() => expect(fake.find("GET", "/audit").length).toBe(2));
    const q = fake.find("GET", "/audit")[1].query;
    expect(q.get("actor_id")).toBe("u-admin");
    expect(q.get("action")).toBe("auth.login");
    expect(q.get("outcome")).toBe("failure");
    expect(q.get("since")).toBe(new Date("2030-01-01T10:00").toISOString());
    expect(q.get("until")).toBeNull();
  });
});
