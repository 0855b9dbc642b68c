/** The one door to the REST API: cookie auth, CSRF header, readable errors. */

export const API_BASE = "/api/v1";
export const CSRF_COOKIE = "nebula_csrf";
export const CSRF_HEADER = "X-CSRF-Token";

const SAFE_METHODS = new Set(["GET", "HEAD", "OPTIONS"]);

export type Method = "GET" | "POST" | "PATCH" | "PUT" | "DELETE";
export type Query = Record<string, string | number | boolean | null | undefined>;

/** An error answered by the API (or the network), carrying the API's own message. */
export class ApiError extends Error {
  readonly status: number;
  readonly detail: unknown;

  constructor(status: number, message: string, detail?: unknown) {
    super(message);
    this.name = "ApiError";
    this.status = status;
    this.detail = detail;
  }
}

interface ValidationItem {
  loc?: unknown[];
  msg?: string;
}

function formatValidationItem(item: unknown): string {
  if (typeof item === "string") return item;
  if (item && typeof item === "object") {
    const { loc, msg } = item as ValidationItem;
    // FastAPI prefixes the location with "body", "query" or "path"; the user only cares about the field.
    const where = Array.isArray(loc)
      ? loc.filter((part) => !["body", "query", "path"].includes(String(part))).join(".")
      : "";
    const text = msg ?? JSON.stringify(item);
    return where ? `${where}: ${text}` : text;
  }
  return String(item);
}

/** Turns a FastAPI `detail` (a string, or a list of {loc, msg}) into one readable line. */
export function formatDetail(detail: unknown): string {
  if (detail === undefined || detail === null || detail === "") return "";
  if (typeof detail === "string") return detail;
  if (Array.isArray(detail)) return detail.map(formatValidationItem).join("; ");
  if (typeof detail === "object") {
    const maybe = detail as { msg?: unknown; message?: unknown };
    if (typeof maybe.msg === "string") return maybe.msg;
    if (typeof maybe.message === "string") return maybe.message;
  }
  return JSON.stringify(detail);
}

const FALLBACK_MESSAGES: Record<number, string> = {
  400: "The request was not valid.",
  401: "You are not signed in.",
  403: "You are not allowed to do that.",
  404: "Not found.",
  409: "That conflicts with the current state.",
  413: "That is too large for the quota.",
  422: "Some fields are not valid.",
  429: "Too many attempts. Wait a few minutes and try again.",
};

function fallbackMessage(status: number): string {
  return FALLBACK_MESSAGES[status] ?? (status >= 500 ? `The server failed (${status}). Try again later.` : `Request failed (${status}).`);
}

/** Reads a cookie that JavaScript may see (the CSRF cookie; the session cookie is HttpOnly). */
export function readCookie(name: string): string | null {
  if (typeof document === "undefined") return null;
  for (const part of document.cookie.split(";")) {
    const eq = part.indexOf("=");
    if (eq < 0) continue;
    if (part.slice(0, eq).trim() === name) return decodeURIComponent(part.slice(eq + 1).trim());
  }
  return null;
}

/** Headers an unsafe, cookie-authenticated request must carry. */
export function csrfHeaders(method: string): Record<string, string> {
  if (SAFE_METHODS.has(method.toUpperCase())) return {};
  const token = readCookie(CSRF_COOKIE);
  return token ? { [CSRF_HEADER]: token } : {};
}

export function buildUrl(path: string, query?: Query): string {
  const url = path.startsWith("/api/") ? path : `${API_BASE}${path.startsWith("/") ? "" : "/"}${path}`;
  if (!query) return url;
  const params = new URLSearchParams();
  for (const [key, value] of Object.entries(query)) {
    if (value === undefined || value === null || value === "") continue;
    params.set(key, String(value));
  }
  const qs = params.toString();
  return qs ? `${url}?${qs}` : url;
}

type UnauthorizedHandler = () => void;
let unauthorizedHandler: UnauthorizedHandler | null = null;

/** Registers what to do when a signed-in request answers 401 (the session ended). */
export function setUnauthorizedHandler(handler: UnauthorizedHandler | null): void {
  unauthorizedHandler = handler;
}

export interface RequestOptions {
  method?: Method;
  query?: Query;
  /** JSON body. */
  json?: unknown;
  /** Multipart body. */
  form?: FormData;
  signal?: AbortSignal;
  /** Do not treat a 401 as "session ended" (the login form wants the message instead). */
  expectUnauthorized?: boolean;
}

async function errorFromResponse(response: Response): Promise<ApiError> {
  let detail: unknown;
  try {
    const text = await response.text();
    if (text) {
      try {
        const body = JSON.parse(text) as { detail?: unknown };
        detail = body && typeof body === "object" && "detail" in body ? body.detail : undefined;
      } catch {
        detail = undefined;
      }
    }
  } catch {
    detail = undefined;
  }
  const message = formatDetail(detail) || fallbackMessage(response.status);
  return new ApiError(response.status, message, detail);
}

/** Makes one API call and returns the parsed JSON (undefined for 204). Throws ApiError. */
export async function request<T = unknown>(path: string, options: RequestOptions = {}): Promise<T> {
  const method = options.method ?? "GET";
  const headers: Record<string, string> = { Accept: "application/json", ...csrfHeaders(method) };
  let body: BodyInit | undefined;
  if (options.form) {
    body = options.form;
  } else if (options.json !== undefined) {
    headers["Content-Type"] = "application/json";
    body = JSON.stringify(options.json);
  }
  let response: Response;
  try {
    response = await fetch(buildUrl(path, options.query), {
      method,
      headers,
      body,
      credentials: "same-origin",
      signal: options.signal,
    });
  } catch (err) {
    if (err instanceof DOMException && err.name === "AbortError") throw err;
    throw new ApiError(0, "Cannot reach the server. Check your connection and try again.");
  }
  if (!response.ok) {
    const error = await errorFromResponse(response);
    if (response.status === 401 && !options.expectUnauthorized) unauthorizedHandler?.();
    throw error;
  }
  if (response.status === 204) return undefined as T;
  const text = await response.text();
  if (!text) return undefined as T;
  try {
    return JSON.parse(text) as T;
  } catch {
    return text as unknown as T;
  }
}

export const api = {
  get: <T>(path: string, query?: Query, signal?: AbortSignal) => request<T>(path, { query, signal }),
  post: <T>(path: string, json?: unknown, extra: Omit<RequestOptions, "method" | "json"> = {}) =>
    request<T>(path, { ...extra, method: "POST", json }),
  patch: <T>(path: string, json?: unknown) => request<T>(path, { method: "PATCH", json }),
  del: <T = void>(path: string) => request<T>(path, { method: "DELETE" }),
};

export interface UploadHandle<T> {
  promise: Promise<T>;
  abort: () => void;
}

/** Multipart upload through XMLHttpRequest, which (unlike fetch) reports upload progress. */
export function uploadWithProgress<T>(
  path: string,
  form: FormData,
  onProgress: (loaded: number, total: number) => void,
): UploadHandle<T> {
  const xhr = new XMLHttpRequest();
  const promise = new Promise<T>((resolve, reject) => {
    xhr.open("POST", buildUrl(path));
    xhr.withCredentials = false; // same-origin requests carry cookies anyway
    xhr.setRequestHeader("Accept", "application/json");
    for (const [name, value] of Object.entries(csrfHeaders("POST"))) xhr.setRequestHeader(name, value);
    xhr.upload.onprogress = (event) => {
      if (event.lengthComputable) onProgress(event.loaded, event.total);
    };
    xhr.onload = () => {
      let parsed: unknown;
      try {
        parsed = xhr.responseText ? JSON.parse(xhr.responseText) : undefined;
      } catch {
        parsed = undefined;
      }
      if (xhr.status >= 200 && xhr.status < 300) {
        resolve(parsed as T);
        return;
      }
      const detail = parsed && typeof parsed === "object" && "detail" in parsed ? (parsed as { detail: unknown }).detail : undefined;
      if (xhr.status === 401) unauthorizedHandler?.();
      reject(new ApiError(xhr.status, formatDetail(detail) || fallbackMessage(xhr.status), detail));
    };
    xhr.onerror = () => reject(new ApiError(0, "The upload failed: cannot reach the server."));
    xhr.onabort = () => reject(new ApiError(0, "The upload was cancelled."));
    xhr.send(form);
  });
  return { promise, abort: () => xhr.abort() };
}

/** A readable message for anything thrown by an API call. */
export function errorMessage(err: unknown): string {
  if (err instanceof ApiError) return err.message;
  if (err instanceof Error) return err.message;
  return String(err);
}
