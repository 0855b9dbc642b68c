import { afterEach, describe, expect, it, vi } from "vitest";
import { ApiError, api, buildUrl, formatDetail, readCookie, request, setUnauthorizedHandler, uploadWithProgress } from "./client";
import { mockApi, reply } from "../test/mockApi";

afterEach(() => {
  setUnauthorizedHandler(null);
  vi.unstubAllGlobals();
});

describe("request", () => {
  it("sends the CSRF header from the nebula_csrf cookie on POST, PATCH and DELETE", async () => {
    document.cookie = "nebula_csrf=tok%2F123";
    const fake = mockApi({ "POST /things": { ok: true }, "PATCH /things/1": { ok: true }, "DELETE /things/1": reply(204) });
    await api.post("/things", { a: 1 });
    await api.patch("/things/1", { b: 2 });
    await api.del("/things/1");
    for (const call of fake.calls) expect(call.headers["x-csrf-token"]).toBe("tok/123");
    expect(fake.calls[0].body).toEqual({ a: 1 });
    expect(fake.calls[0].headers["content-type"]).toBe("application/json");
  });

  it("sends no CSRF header on GET, and always same-origin credentials", async () => {
    document.cookie = "nebula_csrf=abc";
    const fake = mockApi({ "GET /me": { id: "1" } });
    const me = await api.get<{ id: string }>("/me");
    expect(me.id).toBe("1");
    expect(fake.calls[0].headers["x-csrf-token"]).toBeUndefined();
    const init = fake.fetchMock.mock.calls[0][1] as RequestInit;
    expect(init.credentials).toBe("same-origin");
    expect(fake.fetchMock.mock.calls[0][0]).toBe("/api/v1/me");
  });

  it("never puts a token in web storage", async () => {
    const spy = vi.spyOn(Storage.prototype, "setItem");
    mockApi({ "POST /auth/login": { token: "secret", expires_at: "x", user: { id: "1" } } });
    await request("/auth/login", { method: "POST", json: { email: "a", password: "b" }, expectUnauthorized: true });
    expect(spy).not.toHaveBeenCalled();
    expect(localStorage.length).toBe(0);
    expect(sessionStorage.length).toBe(0);
  });

  it("turns {detail} into the error message with the status", async () => {
    mockApi({ "POST /workspaces": reply(409, { detail: "a workspace with that name exists" }) });
    const err = await api.post("/workspaces", { name: "x" }).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(ApiError);
    expect((err as ApiError).status).toBe(409);
    expect((err as ApiError).message).toBe("a workspace with that name exists");
  });

  it("renders FastAPI 422 validation lists readably", async () => {
    mockApi({
      "POST /users": reply(422, {
        detail: [
          { loc: ["body", "email"], msg: "value is not a valid email address", type: "value_error" },
          { loc: ["body", "password"], msg: "String should have at least 1 character", type: "string_too_short" },
        ],
      }),
    });
    const err = (await api.post("/users", {}).catch((e: unknown) => e)) as ApiError;
    expect(err.message).toBe("email: value is not a valid email address; password: String should have at least 1 character");
  });

  it("falls back to a plain message when the body has no detail", async () => {
    mockApi({ "GET /boom": reply(502, "gateway down") });
    const err = (await api.get("/boom").catch((e: unknown) => e)) as ApiError;
    expect(err.status).toBe(502);
    expect(err.message).toMatch(/server failed \(502\)/);
  });

  it("reports a network failure as status 0 with a readable message", async () => {
    vi.stubGlobal("fetch", vi.fn(async () => Promise.reject(new TypeError("Failed to fetch"))));
    const err = (await api.get("/me").catch((e: unknown) => e)) as ApiError;
    expect(err.status).toBe(0);
    expect(err.message).toMatch(/Cannot reach the server/);
  });

  it("answers undefined for 204", async () => {
    mockApi({ "DELETE /me/tokens/t1": reply(204) });
    await expect(api.del("/me/tokens/t1")).resolves.toBeUndefined();
  });

  it("calls the unauthorized handler on 401, except where the caller expects it", async () => {
    const onUnauthorized = vi.fn();
    setUnauthorizedHandler(onUnauthorized);
    mockApi({ "GET /workspaces": reply(401, { detail: "not authenticated" }), "POST /auth/login": reply(401, { detail: "wrong email or password" }) });
    await api.get("/workspaces").catch(() => undefined);
    expect(onUnauthorized).toHaveBeenCalledTimes(1);
    await request("/auth/login", { method: "POST", json: {}, expectUnauthorized: true }).catch(() => undefined);
    expect(onUnauthorized).toHaveBeenCalledTimes(1);
  });
});

describe("helpers", () => {
  it("builds URLs under /api/v1 and drops empty query values", () => {
    expect(buildUrl("/audit", { action: "auth.login", actor_id: "", since: undefined, limit: 50 })).toBe("/api/v1/audit?action=auth.login&limit=50");
    expect(buildUrl("/api/v1/pki/ca.pem")).toBe("/api/v1/pki/ca.pem");
  });

  it("reads one cookie among several", () => {
    document.cookie = "other=1";
    document.cookie = "nebula_csrf=xyz";
    expect(readCookie("nebula_csrf")).toBe("xyz");
    expect(readCookie("missing")).toBeNull();
  });

  it("formats details of every shape", () => {
    expect(formatDetail("plain")).toBe("plain");
    expect(formatDetail([{ loc: ["query", "limit"], msg: "too big" }])).toBe("limit: too big");
    expect(formatDetail({ msg: "m" })).toBe("m");
    expect(formatDetail(undefined)).toBe("");
  });
});

describe("uploadWithProgress", () => {
  class FakeXhr {
    static last: FakeXhr;
    headers: Record<string, string> = {};
    upload: { onprogress: ((e: ProgressEvent) => void) | null } = { onprogress: null };
    onload: (() => void) | null = null;
    onerror: (() => void) | null = null;
    onabort: (() => void) | null = null;
    status = 0;
    responseText = "";
    withCredentials = false;
    method = "";
    url = "";
    sent: unknown;
    constructor() {
      FakeXhr.last = this;
    }
    open(method: string, url: string) {
      this.method = method;
      this.url = url;
    }
    setRequestHeader(name: string, value: string) {
      this.headers[name] = value;
    }
    send(body: unknown) {
      this.sent = body;
    }
    abort() {
      this.onabort?.();
    }
  }

  it("reports progress, sends the CSRF header and resolves with the dataset", async () => {
    vi.stubGlobal("XMLHttpRequest", FakeXhr);
    document.cookie = "nebula_csrf=c1";
    const progress = vi.fn();
    const form = new FormData();
    const handle = uploadWithProgress<{ id: string }>("/workspaces/w1/datasets", form, progress);
    const xhr = FakeXhr.last;
    expect(xhr.method).toBe("POST");
    expect(xhr.url).toBe("/api/v1/workspaces/w1/datasets");
    expect(xhr.headers["X-CSRF-Token"]).toBe("c1");
    expect(xhr.sent).toBe(form);
    xhr.upload.onprogress?.({ lengthComputable: true, loaded: 50, total: 200 } as ProgressEvent);
    expect(progress).toHaveBeenCalledWith(50, 200);
    xhr.status = 201;
    xhr.responseText = JSON.stringify({ id: "d1" });
    xhr.onload?.();
    await expect(handle.promise).resolves.toEqual({ id: "d1" });
  });

  it("rejects with the API's message (413 over quota)", async () => {
    vi.stubGlobal("XMLHttpRequest", FakeXhr);
    const handle = uploadWithProgress("/workspaces/w1/datasets", new FormData(), () => undefined);
    FakeXhr.last.status = 413;
    FakeXhr.last.responseText = JSON.stringify({ detail: "storage quota exceeded" });
    FakeXhr.last.onload?.();
    const err = (await handle.promise.catch((e: unknown) => e)) as ApiError;
    expect(err.status).toBe(413);
    expect(err.message).toBe("storage quota exceeded");
  });
});
