// Calls to the service's HTTP API. Every failure becomes an ApiError whose message is
// meant for people: the service's own {"error": "..."} text where it sent one.

export class ApiError extends Error {
  constructor(message, status = 0) {
    super(message);
    this.name = "ApiError";
    this.status = status;
  }
}

function messageFrom(body, response, text) {
  if (body && typeof body === "object") {
    if (typeof body.error === "string" && body.error) return body.error;
    if (body.error && typeof body.error.message === "string") return body.error.message;
    if (typeof body.detail === "string" && body.detail) return body.detail;
    if (Array.isArray(body.detail)) {
      // FastAPI's validation errors, should one get through unconverted.
      return body.detail
        .map((d) => {
          const where = Array.isArray(d.loc) ? d.loc.filter((x) => x !== "body").join(".") : "";
          return where ? `${where}: ${d.msg}` : d.msg;
        })
        .join("; ");
    }
  }
  const snippet = (text || "").trim().slice(0, 200);
  const reason = response.statusText ? ` ${response.statusText}` : "";
  return `The server answered ${response.status}${reason}${snippet ? `: ${snippet}` : "."}`;
}

async function request(path, options = {}) {
  let response;
  try {
    response = await fetch(path, { headers: { Accept: "application/json" }, ...options });
  } catch (err) {
    throw new ApiError(`Could not reach the translation service (${err.message}).`);
  }
  const text = await response.text();
  let body = null;
  try {
    body = text ? JSON.parse(text) : null;
  } catch {
    body = null;
  }
  if (!response.ok) throw new ApiError(messageFrom(body, response, text), response.status);
  if (body === null) throw new ApiError(`The server sent an answer to ${path} that is not JSON.`, response.status);
  return body;
}

/** [{id, source, target}] from /v1/models (or /v1/languages), whatever the envelope. */
export function normalisePairs(body) {
  const list = Array.isArray(body) ? body : body.models || body.pairs || body.languages || body.data || [];
  const pairs = [];
  for (const item of list) {
    if (typeof item === "string") {
      const [source, target] = item.split("-");
      if (source && target) pairs.push({ id: item, source, target });
      continue;
    }
    if (!item || typeof item !== "object") continue;
    const source = item.source ?? item.source_lang ?? item.src;
    const target = item.target ?? item.target_lang ?? item.tgt;
    if (!source || !target) continue;
    pairs.push({ id: item.id ?? item.model ?? `${source}-${target}`, source, target,
      maxSourceTokens: item.max_source_tokens ?? null });
  }
  const seen = new Set();
  return pairs.filter((p) => {
    const key = `${p.source}-${p.target}`;
    if (seen.has(key)) return false;
    seen.add(key);
    return true;
  });
}

export async function fetchPairs() {
  try {
    const pairs = normalisePairs(await request("/v1/models"));
    if (pairs.length) return pairs;
  } catch (err) {
    // fall through to /v1/languages
    if (!(err instanceof ApiError)) throw err;
  }
  return normalisePairs(await request("/v1/languages"));
}

export function translate(payload) {
  return request("/v1/translate", {
    method: "POST",
    headers: { "Content-Type": "application/json", Accept: "application/json" },
    body: JSON.stringify(payload),
  });
}

export function fetchAlignment(id, granularity) {
  const query = new URLSearchParams({ granularity });
  return request(`/v1/alignments/${encodeURIComponent(id)}?${query}`);
}
