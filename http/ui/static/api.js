// Calls to this server's API. Paths are relative to the page, so a proxy prefix keeps working.
// The API key lives in this tab's sessionStorage only: gone with the tab, never in a cookie.

const KEY_SLOT = "rillet.apiKey";

export class ApiError extends Error {
  constructor(status, message, code = null) {
    super(message);
    this.name = "ApiError";
    this.status = status;
    this.code = code;
  }
}

export function apiKey() {
  return sessionStorage.getItem(KEY_SLOT) || "";
}

export function setApiKey(key) {
  if (key) sessionStorage.setItem(KEY_SLOT, key);
  else sessionStorage.removeItem(KEY_SLOT);
}

// Any 401 asks the page for a key (app.js listens).
export const authEvents = new EventTarget();

export async function api(path, { method = "GET", body, signal } = {}) {
  const headers = {};
  const key = apiKey();
  if (key) headers.Authorization = `Bearer ${key}`;
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const resp = await fetch(path, {
    method,
    headers,
    body: body === undefined ? undefined : JSON.stringify(body),
    signal,
    cache: "no-store",
    credentials: "omit",
  });
  if (resp.ok) return resp;
  const err = await errorOf(resp);
  if (resp.status === 401) authEvents.dispatchEvent(new CustomEvent("needkey", { detail: err.message }));
  throw err;
}

// The OpenAI-shaped error body's message, or the status line.
async function errorOf(resp) {
  let message = `HTTP ${resp.status} ${resp.statusText}`.trim();
  let code = null;
  try {
    const body = await resp.json();
    if (body && body.error && typeof body.error.message === "string") {
      message = body.error.message;
      code = body.error.code ?? null;
    }
  } catch {
    // not JSON: keep the status line
  }
  return new ApiError(resp.status, message, code);
}
