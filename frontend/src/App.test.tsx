import { screen, waitFor, within } from "@testing-library/react";
import userEvent from "@testing-library/user-event";
import { afterEach, describe, expect, it, vi } from "vitest";
import { admin, auditor, member, mockApi, page, reply } from "./test/mockApi";
import { renderApp } from "./test/render";
import { navItemsFor } from "./components/Layout";

afterEach(() => vi.unstubAllGlobals());

const emptyLists = {
  "GET /workspaces": page([]),
  "POST /auth/logout": reply(204),
};

describe("sign-in", () => {
  it("shows the API's own message on 401 and stays on the form", async () => {
    const fake = mockApi({
      "GET /me": reply(401, { detail: "not authenticated" }),
      "POST /auth/login": reply(401, { detail: "Wrong email or password." }),
    });
    renderApp("/workspaces");
    const user = userEvent.setup();
    await user.type(await screen.findByLabelText("Email"), "mia@example.org");
    await user.type(screen.getByLabelText("Password"), "not-the-password");
    await user.click(screen.getByRole("button", { name: "Sign in" }));
    expect(await screen.findByRole("alert")).toHaveTextContent("Wrong email or password.");
    expect(screen.getByLabelText("Password")).toHaveValue("");
    expect(fake.find("POST", "/auth/login")[0].body).toEqual({ email: "mia@example.org", password: "not-the-password" });
  });

  it("shows the lockout message on 429", async () => {
    mockApi({
      "GET /me": reply(401, { detail: "not authenticated" }),
      "POST /auth/login": reply(429, { detail: "Too many failed attempts; try again in 15 minutes." }),
    });
    renderApp("/");
    const user = userEvent.setup();
    await user.type(await screen.findByLabelText("Email"), "mia@example.org");
    await user.type(screen.getByLabelText("Password"), "x");
    await user.click(screen.getByRole("button", { name: "Sign in" }));
    expect(await screen.findByRole("alert")).toHaveTextContent("Too many failed attempts");
  });

  it("signs in, lands on the requested page, and signs out", async () => {
    let signedIn = false;
    const fake = mockApi({
      ...emptyLists,
      "GET /me": () => (signedIn ? member : reply(401, { detail: "not authenticated" })),
      "POST /auth/login": () => {
        signedIn = true;
        return { token: "t", expires_at: "2030-01-01T00:00:00Z", user: member };
      },
    });
    renderApp("/workspaces");
    const user = userEvent.setup();
    await user.type(await screen.findByLabelText("Email"), "mia@example.org");
    await user.type(screen.getByLabelText("Password"), "correct horse battery");
    await user.click(screen.getByRole("button", { name: "Sign in" }));
    expect(await screen.findByRole("heading", { level: 1, name: "Workspaces" })).toBeInTheDocument();
    expect(localStorage.length).toBe(0);

    await user.click(screen.getByRole("button", { name: "Sign out" }));
    expect(await screen.findByRole("heading", { name: "Sign in" })).toBeInTheDocument();
    expect(fake.find("POST", "/auth/logout")).toHaveLength(1);
  });

  it("goes back to the sign-in form when the session ends (a later 401)", async () => {
    let alive = true;
    mockApi({
      "GET /me": () => (alive ? member : reply(401, { detail: "not authenticated" })),
      "GET /workspaces": () => {
        alive = false;
        return reply(401, { detail: "session expired" });
      },
    });
    renderApp("/workspaces");
    expect(await screen.findByText("Your session ended. Sign in again to continue.")).toBeInTheDocument();
  });
});

describe("navigation by role", () => {
  it("hides Admin and Audit from members, and does not route them", async () => {
    mockApi({ ...emptyLists, "GET /me": member });
    renderApp("/admin/users");
    const nav = await screen.findByRole("navigation", { name: "Primary" });
    expect(within(nav).queryByRole("link", { name: "Users" })).toBeNull();
    expect(within(nav).queryByRole("link", { name: "Audit log" })).toBeNull();
    expect(within(nav).queryByText("Admin")).toBeNull();
    expect(within(nav).getByRole("link", { name: "Workspaces" })).toBeInTheDocument();
    expect(screen.getByRole("heading", { level: 1, name: "Page not found" })).toBeInTheDocument();
  });

  it("offers Admin and Audit to admins", async () => {
    mockApi({ ...emptyLists, "GET /me": admin });
    renderApp("/workspaces");
    const nav = await screen.findByRole("navigation", { name: "Primary" });
    for (const name of ["Users", "Clusters", "Running jobs", "Quotas", "Audit log"]) expect(within(nav).getByRole("link", { name })).toBeInTheDocument();
  });

  it("offers Audit but not Admin to auditors", async () => {
    mockApi({ ...emptyLists, "GET /me": auditor, "GET /audit/verify": { ok: true, count: 3, first_bad_seq: null }, "GET /audit": page([]) });
    renderApp("/audit");
    const nav = await screen.findByRole("navigation", { name: "Primary" });
    expect(within(nav).getByRole("link", { name: "Audit log" })).toBeInTheDocument();
    expect(within(nav).queryByRole("link", { name: "Users" })).toBeNull();
    expect(await screen.findByRole("heading", { level: 1, name: "Audit log" })).toBeInTheDocument();
  });

  it("lists the pages per role", () => {
    expect(navItemsFor({ role: "member" }).admin).toEqual([]);
    expect(navItemsFor({ role: "member" }).audit).toEqual([]);
    expect(navItemsFor({ role: "auditor" }).audit.map((i) => i.to)).toEqual(["/audit"]);
    expect(navItemsFor({ role: "admin" }).admin.map((i) => i.to)).toEqual(["/admin/users", "/admin/clusters", "/admin/jobs", "/admin/quotas"]);
  });

  it("toggles the phone menu with an accessible button", async () => {
    mockApi({ ...emptyLists, "GET /me": member });
    renderApp("/workspaces");
    const button = await screen.findByRole("button", { name: "Menu" });
    expect(button).toHaveAttribute("aria-expanded", "false");
    await userEvent.setup().click(button);
    await waitFor(() => expect(screen.getByRole("button", { name: "Close menu" })).toHaveAttribute("aria-expanded", "true"));
  });
});
