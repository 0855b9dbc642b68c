import { screen, waitFor } from "@testing-library/react";
import userEvent from "@testing-library/user-event";
import { afterEach, describe, expect, it, vi } from "vitest";
import { member, mockApi, page, reply } from "../test/mockApi";
import { renderPage } from "../test/render";
import { AccountPage } from "./AccountPage";

afterEach(() => vi.unstubAllGlobals());

const noFactor = { enrolled: false, recovery_codes_left: 0, required: false };

describe("AccountPage", () => {
  it("creates a token, shows it once, and revokes it", async () => {
    const tokens: { id: string; name: string; created_at: string; expires_at: string; revoked_at: string | null }[] = [];
    const fake = mockApi({
      "GET /me": member,
      "GET /me/audit": page([]),
      "GET /me/totp": noFactor,
      "GET /me/tokens": () => page(tokens),
      "POST /me/tokens": (c: { body: { name: string; expires_in_days: number } }) => {
        const t = { id: "t1", name: c.body.name, created_at: "2030-01-01T00:00:00Z", expires_at: "2099-01-01T00:00:00Z", revoked_at: null };
        tokens.push(t);
        return reply(201, { ...t, token: "nbl_secret_value" });
      },
      "DELETE /me/tokens/t1": () => {
        tokens[0].revoked_at = "2030-01-02T00:00:00Z";
        return reply(204);
      },
    });
    renderPage(<AccountPage />, { path: "/account", route: "/account" });
    const user = userEvent.setup();
    expect(await screen.findByText("No API tokens yet.")).toBeInTheDocument();
    await user.type(screen.getByLabelText("Token name"), "laptop");
    await user.clear(screen.getByLabelText("Expires in (days)"));
    await user.type(screen.getByLabelText("Expires in (days)"), "7");
    await user.click(screen.getByRole("button", { name: "Create token" }));
    expect(await screen.findByLabelText("New token “laptop”")).toHaveValue("nbl_secret_value");
    expect(fake.find("POST", "/me/tokens")[0].body).toEqual({ name: "laptop", expires_in_days: 7 });
    expect(await screen.findByText("active")).toBeInTheDocument();

    await user.click(screen.getByRole("button", { name: "Revoke laptop" }));
    await user.click(screen.getByRole("button", { name: "Yes, revoke" }));
    await waitFor(() => expect(fake.find("DELETE", "/me/tokens/t1")).toHaveLength(1));
    expect(await screen.findByText("revoked")).toBeInTheDocument();
    expect(screen.queryByDisplayValue("nbl_secret_value")).toBeNull();
    // the page renders four cards now; typing through all of them passes 5 s on a loaded machine
  }, 15_000);

  it("changes the password and shows a weak-password error as the API words it", async () => {
    let attempt = 0;
    const fake = mockApi({
      "GET /me": member,
      "GET /me/audit": page([]),
      "GET /me/totp": noFactor,
      "GET /me/tokens": page([]),
      "POST /me/password": () => (++attempt === 1 ? reply(422, { detail: "password is too common" }) : reply(204)),
    });
    renderPage(<AccountPage />, { path: "/account", route: "/account" });
    const user = userEvent.setup();
    await user.type(await screen.findByLabelText("Current password"), "old password 1");
    await user.type(screen.getByLabelText("New password"), "password1234");
    await user.type(screen.getByLabelText("Repeat new password"), "password1234");
    await user.click(screen.getByRole("button", { name: "Change password" }));
    expect(await screen.findByRole("alert")).toHaveTextContent("password is too common");
    await user.click(screen.getByRole("button", { name: "Change password" }));
    expect(await screen.findByText(/Password changed/)).toBeInTheDocument();
    expect(fake.find("POST", "/me/password")[1].body).toEqual({ current_password: "old password 1", new_password: "password1234" });
  });

  it("refuses mismatched new passwords before calling the API", async () => {
    const fake = mockApi({ "GET /me": member, "GET /me/audit": page([]), "GET /me/totp": noFactor, "GET /me/tokens": page([]) });
    renderPage(<AccountPage />, { path: "/account", route: "/account" });
    const user = userEvent.setup();
    await user.type(await screen.findByLabelText("Current password"), "old password 1");
    await user.type(screen.getByLabelText("New password"), "a long new password");
    await user.type(screen.getByLabelText("Repeat new password"), "another long password");
    await user.click(screen.getByRole("button", { name: "Change password" }));
    expect(await screen.findByRole("alert")).toHaveTextContent("do not match");
    expect(fake.find("POST", "/me/password")).toHaveLength(0);
  });

  it("enrols a second factor from a QR code and shows the recovery codes once", async () => {
    let status = { ...noFactor, required: true };
    const codes = Array.from({ length: 10 }, (_, i) => `abcde-fgh${i}k`);
    const fake = mockApi({
      "GET /me": member,
      "GET /me/audit": page([]),
      "GET /me/tokens": page([]),
      "GET /me/totp": () => status,
      "POST /me/totp": reply(201, { secret: "JBSWY3DPEHPK3PXP", otpauth_uri: "otpauth://totp/Nebula:x", qr_svg: "<svg xmlns='http://www.w3.org/2000/svg'></svg>" }),
      "POST /me/totp/confirm": () => {
        status = { enrolled: true, recovery_codes_left: 10, required: true };
        return reply(200, { recovery_codes: codes });
      },
    });
    renderPage(<AccountPage />, { path: "/account", route: "/account" });
    const user = userEvent.setup();
    expect(await screen.findByText(/requires administrators to use a second factor/)).toBeInTheDocument();
    await user.click(screen.getByRole("button", { name: "Set up an authenticator app" }));
    const qr = await screen.findByRole("img", { name: "QR code for your authenticator app" });
    expect(qr.getAttribute("src")).toMatch(/^data:image\/svg\+xml/);
    expect(screen.getByText("JBSWY3DPEHPK3PXP")).toBeInTheDocument();
    await user.type(screen.getByLabelText("Code from the app"), "123456");
    await user.click(screen.getByRole("button", { name: "Confirm" }));
    expect(await screen.findByRole("textbox", { name: /Recovery codes/ })).toHaveValue(codes.join(" "));
    expect(fake.find("POST", "/me/totp/confirm")[0].body).toEqual({ code: "123456" });
    expect(await screen.findByText(/10 recovery codes left/)).toBeInTheDocument();
    // required for this admin: no way to remove it here
    expect(screen.queryByRole("button", { name: "Remove second factor" })).toBeNull();
  });

  it("asks for a fresh code to mint a token once a factor is enrolled", async () => {
    const fake = mockApi({
      "GET /me": member,
      "GET /me/audit": page([]),
      "GET /me/tokens": page([]),
      "GET /me/totp": { enrolled: true, recovery_codes_left: 9, required: false },
      "POST /me/tokens": reply(201, { id: "t1", name: "ci", created_at: "2030-01-01T00:00:00Z", expires_at: "2099-01-01T00:00:00Z", revoked_at: null, token: "nbt_x" }),
    });
    renderPage(<AccountPage />, { path: "/account", route: "/account" });
    const user = userEvent.setup();
    await user.type(await screen.findByLabelText("Token name"), "ci");
    await user.type(await screen.findByLabelText("Code from your app"), "654321");
    await user.click(screen.getByRole("button", { name: "Create token" }));
    await waitFor(() => expect(fake.find("POST", "/me/tokens")).toHaveLength(1));
    expect(fake.find("POST", "/me/tokens")[0].body).toEqual({ name: "ci", expires_in_days: 30, otp: "654321" });
  });
});
