// Server-sent events of a fetch() response: yields each `data:` payload parsed as JSON, stops at
// [DONE]. (EventSource cannot POST nor send an Authorization header.)

export async function* sseEvents(resp) {
  const reader = resp.body.pipeThrough(new TextDecoderStream()).getReader();
  let buf = "";
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      buf += value.replaceAll("\r\n", "\n");
      let end;
      while ((end = buf.indexOf("\n\n")) >= 0) {
        const block = buf.slice(0, end);
        buf = buf.slice(end + 2);
        const data = block
          .split("\n")
          .filter((line) => line.startsWith("data:"))
          .map((line) => line.slice(5).replace(/^ /, ""))
          .join("\n");
        if (!data) continue;
        if (data === "[DONE]") return;
        yield JSON.parse(data);
      }
    }
  } finally {
    reader.cancel().catch(() => {}); // early return or abort: close the body
  }
}
