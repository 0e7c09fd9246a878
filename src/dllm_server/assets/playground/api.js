// Talking to the server: one streamed completion with denoising progress, read as SSE from fetch
// (EventSource cannot POST nor send a header). Every failure becomes a RequestError whose text
// says what happened and what to do.

export class RequestError extends Error {
  constructor(kind, message, status = null) {
    super(message);
    this.kind = kind;        // "http" | "network" | "dropped" | "server" | "stopped"
    this.status = status;
  }
}

function headers(key) {
  const h = {"Content-Type": "application/json", "Accept": "text/event-stream"};
  if (key) h["Authorization"] = "Bearer " + key;   // never in the URL
  return h;
}

async function httpError(resp, key) {
  let detail = "";
  try {
    detail = (await resp.json()).error.message;
  } catch (_) { /* not our JSON: the status says enough */ }
  const wait = resp.headers.get("Retry-After");
  if (resp.status === 401) {
    return new RequestError("http", key
      ? "The server did not accept this API key (401). Check the key and send again."
      : "This server needs an API key (401). Enter it under “API key” and send again.", 401);
  }
  if (resp.status === 503) {
    return new RequestError("http", `The server is busy and refused the request (503: ${detail || "unavailable"}).`
      + (wait ? ` Try again in ${wait} s.` : " Try again shortly."), 503);
  }
  if (resp.status === 400 || resp.status === 404) {
    return new RequestError("http", `The server refused the request (${resp.status}): ${detail}`, resp.status);
  }
  return new RequestError("http", `The server answered ${resp.status}${detail ? ": " + detail : ""}.`, resp.status);
}

// POST `body` to `path`; onOpen() once the server accepted it, onEvent(json) for every SSE data
// event until [DONE].
export async function stream(path, body, {key, signal, onOpen, onEvent}) {
  let resp;
  try {
    resp = await fetch(path, {method: "POST", headers: headers(key), body: JSON.stringify(body), signal,
                              cache: "no-store"});
  } catch (err) {
    if (signal.aborted) throw new RequestError("stopped", "Stopped before the server answered.");
    throw new RequestError("network", "Cannot reach the server: the connection failed. Is it running?");
  }
  if (!resp.ok) throw await httpError(resp, key);
  onOpen();
  const reader = resp.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    let chunk;
    try {
      chunk = await reader.read();
    } catch (err) {
      if (signal.aborted) throw new RequestError("stopped", "Stopped: the connection is closed, so the server aborts the "
        + "request and frees its KV cache.");
      throw new RequestError("dropped", "The connection to the server was lost in the middle of the answer.");
    }
    if (chunk.done) {
      throw new RequestError("dropped", "The connection to the server closed before the answer was complete.");
    }
    buffer += decoder.decode(chunk.value, {stream: true});
    let cut;
    while ((cut = buffer.indexOf("\n\n")) >= 0) {
      const event = buffer.slice(0, cut);
      buffer = buffer.slice(cut + 2);
      for (const line of event.split("\n")) {
        if (!line.startsWith("data: ")) continue;     // ": keep-alive" comments and the like
        const data = line.slice(6);
        if (data === "[DONE]") {
          reader.cancel().catch(() => {});
          return;
        }
        const obj = JSON.parse(data);
        if (obj.error) throw new RequestError("server", "The server reported an error: " + obj.error.message);
        onEvent(obj);
      }
    }
  }
}

export async function serverInfo() {
  const resp = await fetch("/playground/info", {cache: "no-store"});
  if (!resp.ok) throw new Error("info " + resp.status);
  return resp.json();
}
