// The chat tab: settings, the conversation, one streamed answer at a time.

import { api } from "./api.js";
import { $, el } from "./dom.js";
import { sseEvents } from "./sse.js";

export class Chat {
  constructor() {
    this.history = []; // finished turns: {role, content}, sent again with each new message
    this.abort = null; // AbortController of the answer being streamed
    this.epoch = 0; // bumped by "New chat": an answer cut off by it joins no conversation
    this.list = $("messages");
    this.prompt = $("prompt");
    $("composer").addEventListener("submit", (e) => {
      e.preventDefault();
      this.send();
    });
    this.prompt.addEventListener("keydown", (e) => {
      if (e.key === "Enter" && !e.shiftKey && !e.isComposing) {
        e.preventDefault();
        this.send();
      }
    });
    $("stop").addEventListener("click", () => this.abort?.abort());
    $("new-chat").addEventListener("click", () => this.reset());
  }

  setModels(models) {
    const select = $("model");
    const keep = select.value;
    select.replaceChildren(...models.map((m) => new Option(m.label, m.id)));
    if (models.some((m) => m.id === keep)) select.value = keep;
  }

  reset() {
    this.epoch += 1;
    this.abort?.abort();
    this.history = [];
    this.list.replaceChildren();
  }

  request(text) {
    const num = (id) => $(id).valueAsNumber;
    const messages = [];
    const system = $("system").value.trim();
    if (system) messages.push({ role: "system", content: system });
    messages.push(...this.history, { role: "user", content: text });
    const body = {
      model: $("model").value,
      messages,
      stream: true,
      stream_options: { include_usage: true },
    };
    for (const key of ["temperature", "top_p", "max_tokens"]) {
      if (!Number.isNaN(num(key))) body[key] = num(key);
    }
    if (!Number.isNaN(num("seed"))) body.seed = Math.trunc(num("seed"));
    return body;
  }

  async send() {
    const text = this.prompt.value.trim();
    if (!text || this.abort) return;
    const body = this.request(text);
    this.prompt.value = "";
    this.addMessage("user", text);
    const view = this.addMessage("assistant", "");
    const ctrl = new AbortController();
    const epoch = this.epoch;
    this.abort = ctrl;
    this.setBusy(true);
    const run = await stream(body, ctrl.signal, (delta) => {
      view.text.appendData(delta);
      this.scroll();
    });
    this.abort = null;
    this.setBusy(false);
    if (run.error) view.item.append(el("div", "error", run.error));
    const stats = statsView(run);
    if (stats.textContent) view.item.append(stats);
    view.item.dataset.state = run.state;
    if (run.content && run.state !== "error" && epoch === this.epoch) {
      this.history.push({ role: "user", content: text }, { role: "assistant", content: run.content });
    }
    this.scroll();
  }

  addMessage(role, text) {
    const item = el("li", `msg ${role}`);
    item.dataset.state = role === "assistant" ? "streaming" : "done";
    item.append(el("div", "role", role));
    const body = el("div", "content");
    const node = document.createTextNode(text);
    body.append(node);
    item.append(body);
    this.list.append(item);
    this.scroll();
    return { item, text: node };
  }

  setBusy(busy) {
    $("send").disabled = busy;
    $("stop").disabled = !busy;
  }

  scroll() {
    this.list.scrollTop = this.list.scrollHeight;
  }
}

// One streamed request: the text as it arrives, client-side timings, the server's usage.
async function stream(body, signal, onDelta) {
  const run = { state: "done", content: "", usage: null, finish: null, error: null };
  const t0 = performance.now();
  run.start = t0;
  try {
    const resp = await api("v1/chat/completions", { method: "POST", body, signal });
    for await (const event of sseEvents(resp)) {
      if (event.error) throw new Error(event.error.message || "the server reported an error");
      if (event.usage) run.usage = event.usage;
      for (const choice of event.choices || []) {
        const delta = choice.delta?.content;
        if (delta) {
          const now = performance.now();
          run.first ??= now;
          run.last = now;
          run.content += delta;
          onDelta(delta);
        }
        if (choice.finish_reason) run.finish = choice.finish_reason;
      }
    }
  } catch (err) {
    if (err.name === "AbortError") run.state = "stopped";
    else {
      run.state = "error";
      run.error = err.message || String(err);
    }
  }
  run.end = performance.now();
  run.ttft = run.first === undefined ? null : run.first - t0;
  return run;
}

function statsView(run) {
  const stats = el("div", "stats");
  const parts = [];
  if (run.ttft !== null) {
    parts.push(`TTFT ${Math.round(run.ttft)} ms`);
    stats.dataset.ttftMs = String(Math.round(run.ttft));
  }
  const u = run.usage;
  if (u) {
    const cached = u.prompt_tokens_details?.cached_tokens ?? 0;
    if (u.completion_tokens > 1 && run.last > run.first) {
      const rate = (u.completion_tokens - 1) / ((run.last - run.first) / 1000);
      parts.push(`${rate.toFixed(1)} tok/s`);
    }
    parts.push(`prompt ${u.prompt_tokens} (cached ${cached})`, `completion ${u.completion_tokens}`);
    Object.assign(stats.dataset, {
      promptTokens: String(u.prompt_tokens),
      cachedTokens: String(cached),
      completionTokens: String(u.completion_tokens),
    });
  }
  if (run.state === "stopped") parts.push(`stopped after ${((run.end - run.start) / 1000).toFixed(1)} s`);
  else if (run.finish) parts.push(`finish: ${run.finish}`);
  stats.textContent = parts.join(" · ");
  return stats;
}
