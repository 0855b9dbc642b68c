/** A fake API behind `fetch`, for component tests: routes by "METHOD /path" (without /api/v1 and query). */
import { vi } from "vitest";

export interface Call {
  method: string;
  path: string;
  query: URLSearchParams;
  headers: Record<string, string>;
  body: unknown;
}

type Answer = unknown | ((call: Call) => unknown);

export class Reply {
  constructor(
    readonly status: number,
    readonly body?: unknown,
  ) {}
}

export function reply(status: number, body?: unknown): Reply {
  return new Reply(status, body);
}

export function mockApi(routes: Record<string, Answer>) {
  const calls: Call[] = [];
  const fetchMock = vi.fn(async (input: RequestInfo | URL, init: RequestInit = {}) => {
    const url = new URL(String(input), "http://localhost");
    const method = (init.method ?? "GET").toUpperCase();
    const path = url.pathname.replace(/^\/api\/v1/, "");
    const headers: Record<string, string> = {};
    new Headers(init.headers).forEach((v, k) => (headers[k.toLowerCase()] = v));
    let body: unknown = init.body;
    if (typeof init.body === "string") {
      try {
        body = JSON.parse(init.body);
      } catch {
        body = init.body;
      }
    }
    const call: Call = { method, path, query: url.searchParams, headers, body };
    calls.push(call);
    const key = `${method} ${path}`;
    let answer: unknown = key in routes ? routes[key] : undefined;
    if (answer === undefined) {
      // Patterns: "GET /jobs/*" matches one path segment.
      const match = Object.keys(routes).find((k) => {
        const [m, p] = k.split(" ");
        if (m !== method || !p.includes("*")) return false;
        const re = new RegExp(`^${p.replace(/[.+?^${}()|[\]\\]/g, "\\$&").replace(/\*/g, "[^/]+")}$`);
        return re.test(path);
      });
      answer = match ? routes[match] : reply(404, { detail: `no fake route for ${key}` });
    }
    if (typeof answer === "function") answer = (answer as (c: Call) => unknown)(call);
    answer = await answer;
    const r = answer instanceof Reply ? answer : reply(method === "DELETE" ? 204 : 200, answer);
    if (r.status === 204 || r.body === undefined) return new Response(null, { status: r.status === 200 ? 204 : r.status });
    return new Response(JSON.stringify(r.body), { status: r.status, headers: { "Content-Type": "application/json" } });
  });
  vi.stubGlobal("fetch", fetchMock);
  return {
    calls,
    fetchMock,
    find: (method: string, path: string) => calls.filter((c) => c.method === method && c.path === path),
  };
}

export const member = { id: "u-member", email: "mia@example.org", display_name: "Mia", role: "member" as const, status: "active" as const };
export const admin = { id: "u-admin", email: "ada@example.org", display_name: "Ada", role: "admin" as const, status: "active" as const };
export const auditor = { id: "u-aud", email: "otto@example.org", display_name: "Otto", role: "auditor" as const, status: "active" as const };

export function page<T>(items: T[]) {
  return { items, total: items.length };
}

/** A controllable stand-in for EventSource. */
export class FakeEventSource {
  static instances: FakeEventSource[] = [];
  url: string;
  withCredentials: boolean;
  readyState = 0;
  onopen: ((e: Event) => void) | null = null;
  onmessage: ((e: MessageEvent) => void) | null = null;
  onerror: ((e: Event) => void) | null = null;
  closed = false;
  private listeners: Record<string, ((e: MessageEvent) => void)[]> = {};

  constructor(url: string, init?: EventSourceInit) {
    this.url = url;
    this.withCredentials = Boolean(init?.withCredentials);
    FakeEventSource.instances.push(this);
  }
  addEventListener(type: string, fn: (e: MessageEvent) => void) {
    (this.listeners[type] ??= []).push(fn);
  }
  removeEventListener() {}
  close() {
    this.closed = true;
    this.readyState = 2;
  }
  emit(data: unknown, type = "message") {
    const event = new MessageEvent(type, { data: JSON.stringify(data) });
    if (type === "message") this.onmessage?.(event);
    for (const fn of this.listeners[type] ?? []) fn(event);
  }
  fail() {
    this.onerror?.(new Event("error"));
  }
  static latest(): FakeEventSource {
    return FakeEventSource.instances[FakeEventSource.instances.length - 1];
  }
}
