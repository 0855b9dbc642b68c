import { screen } from "@testing-library/react";
import userEvent from "@testing-library/user-event";
import { afterEach, describe, expect, it, vi } from "vitest";
import { member, mockApi, page, reply } from "../test/mockApi";
import { renderApp } from "../test/render";

afterEach(() => vi.unstubAllGlobals());

describe("LoginPage", () => {
  it("asks for a second-factor code when the account has one, then signs in", async () => {
    let signedIn = false;
    const fake = mockApi({
      "GET /workspaces": page([]),
      "GET /me": () => (signedIn ? member : reply(401, { detail: "not authenticated" })),
      "POST /auth/login": (c: { body: { otp?: string } }) => {
        if (!c.body.otp) return reply(401, { detail: "a second-factor code is required" });
        signedIn = true;
        return { token: "t", expires_at: "2030-01-01T00:00:00Z", user: member };
      },
    });
    renderApp("/workspaces");
    const user = userEvent.setup();
    await user.type(await screen.findByLabelText("Email"), "mia@example.org");
    await user.type(screen.getByLabelText("Password"), "correct horse battery");
    await user.click(screen.getByRole("button", { name: "Sign in" }));
    await user.type(await screen.findByLabelText("Code from your authenticator app"), "123456");
    expect(screen.queryByRole("alert")).toBeNull();
    await user.click(screen.getByRole("button", { name: "Sign in" }));
    expect(await screen.findByRole("heading", { level: 1, name: "Workspaces" })).toBeInTheDocument();
    expect(fake.find("POST", "/auth/login")[1].body).toEqual({ email: "mia@example.org", password: "correct horse battery", otp: "123456" });
  });

  it("mails a reset link and says the same whatever the address", async () => {
    const fake = mockApi({
      "GET /me": reply(401, { detail: "not authenticated" }),
      "POST /auth/forgot-password": reply(202, { detail: "if an account has this address, a reset link has been sent to it" }),
    });
    renderApp("/");
    const user = userEvent.setup();
    await user.click(await screen.findByRole("button", { name: "Forgot password?" }));
    await user.type(screen.getByLabelText("Email"), "mia@example.org");
    await user.click(screen.getByRole("button", { name: "Send reset link" }));
    expect(await screen.findByRole("status")).toHaveTextContent("If an account has this address, a reset link has been sent to it.");
    expect(fake.find("POST", "/auth/forgot-password")[0].body).toEqual({ email: "mia@example.org" });
  });

  it("offers single sign-on with the provider's name, and hides passwords when SSO is required", async () => {
    mockApi({
      "GET /me": reply(401, { detail: "not authenticated" }),
      "GET /auth/oidc": { enabled: true, provider_name: "Example University", password_login: false },
    });
    renderApp("/");
    const link = await screen.findByRole("link", { name: "Sign in with Example University" });
    expect(link).toHaveAttribute("href", "/api/v1/auth/oidc/login");
    expect(screen.queryByLabelText("Password")).toBeNull();
  });
});
