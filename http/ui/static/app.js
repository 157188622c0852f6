// The page: two tabs (chat, dashboard), the server's status, and the API-key prompt.

import { api, apiKey, authEvents, setApiKey } from "./api.js";
import { Chat } from "./chat.js";
import { Dashboard } from "./dashboard.js";
import { $ } from "./dom.js";

const TABS = ["chat", "dashboard"];
const chat = new Chat();
const dashboard = new Dashboard();

function showTab(name) {
  for (const tab of TABS) {
    $(`tab-${tab}`).setAttribute("aria-selected", String(tab === name));
    $(`view-${tab}`).hidden = tab !== name;
  }
  if (name === "dashboard") dashboard.render();
  window.history.replaceState(null, "", name === "chat" ? location.pathname : `#${name}`);
}

function setStatus(state, text) {
  const node = $("server-status");
  node.dataset.state = state;
  node.textContent = text;
}

async function loadModels() {
  try {
    const body = await (await api("v1/models")).json();
    // the base model first, then its LoRA adapters (cards with a `parent`), labelled as such
    const base = body.data.filter((m) => !m.parent);
    const adapters = body.data.filter((m) => m.parent);
    chat.setModels([
      ...base.map((m) => ({ id: m.id, label: m.id })),
      ...adapters.map((m) => ({ id: m.id, label: `${m.id} (LoRA on ${m.parent})` })),
    ]);
    const extra = adapters.length ? ` + ${adapters.length} LoRA adapter${adapters.length > 1 ? "s" : ""}` : "";
    setStatus("ok", `ready · ${base.map((m) => m.id).join(", ")}${extra}`);
  } catch (err) {
    if (err.status === 401) {
      setStatus("error", "API key needed");
      return; // the key dialog retries
    }
    setStatus(err.status === 503 ? "loading" : "error", err.message);
    setTimeout(loadModels, 2000);
  }
  $("key-forget").hidden = !apiKey();
}

function askForKey(message) {
  const dialog = $("key-dialog");
  if (dialog.open) return;
  const error = $("key-error");
  error.hidden = !apiKey();
  error.textContent = apiKey() ? `The key was refused: ${message}` : "";
  dialog.showModal();
}

authEvents.addEventListener("needkey", (e) => askForKey(e.detail));
$("key-form").addEventListener("submit", (e) => {
  e.preventDefault();
  setApiKey($("key-input").value.trim());
  $("key-input").value = "";
  $("key-dialog").close();
  loadModels();
});
$("key-forget").addEventListener("click", () => {
  setApiKey("");
  location.reload();
});
for (const tab of TABS) $(`tab-${tab}`).addEventListener("click", () => showTab(tab));

showTab(location.hash === "#dashboard" ? "dashboard" : "chat");
loadModels();
dashboard.start();
