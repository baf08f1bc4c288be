// fleettune dashboard: draw the plotly figures embedded in the page, load the ones served by
// the API, and keep the page live: poll /api/stamp, and when it changed fetch the page again and
// swap its live regions (.live[id]) and figures in place (Plotly.react keeps zoom), so open
// sections, scroll and zoom stay. A failed poll or refresh shows its error instead of freezing.
"use strict";

const PLOT_CONFIG = { displaylogo: false, responsive: true };
const POLL_MS = 5000;

function draw(div, fig) {
  return Plotly.newPlot(div, fig.data, fig.layout, PLOT_CONFIG);
}

function drawEmbedded(root) {
  for (const div of root.querySelectorAll("[data-figure]")) {
    const src = document.getElementById(div.dataset.figure);
    if (src) draw(div, JSON.parse(src.textContent));
  }
}

async function drawFetched() {
  for (const div of document.querySelectorAll("[data-src]")) {
    try {
      const r = await fetch(div.dataset.src);
      const body = await r.json();
      if (body.figure) {
        div.textContent = "";
        await draw(div, body.figure);
      } else {
        div.innerHTML = "";
        const p = document.createElement("p");
        p.className = "muted";
        const label = div.dataset.label || "parameter importances";
        p.textContent = label + ": " + (body.caveat || body.error || body.detail || "none");
        div.appendChild(p);
      }
      div.dataset.loaded = "1";
    } catch (e) {
      div.textContent = "could not load " + div.dataset.src + ": " + e;
      div.dataset.loaded = "1";
    }
  }
}

let lastStamp = null;
let lastGood = null;

function showError(text) {
  const box = document.getElementById("live-error");
  const since = lastGood ? " · showing what was read at " + lastGood.toLocaleTimeString() : "";
  box.textContent = "live refresh failed: " + text + since;
  box.hidden = false;
  document.getElementById("refreshed").textContent =
    "check failed " + new Date().toLocaleTimeString();
}

function clearError() {
  document.getElementById("live-error").hidden = true;
  lastGood = new Date();
  document.getElementById("refreshed").textContent = "checked " + lastGood.toLocaleTimeString();
}

async function detail(r) {
  try {
    return (await r.json()).detail || r.statusText;
  } catch (e) {
    return r.statusText;
  }
}

async function refresh() {
  const r = await fetch(location.href, { cache: "no-store" });
  if (!r.ok) {
    const doc = new DOMParser().parseFromString(await r.text(), "text/html");
    const msg = doc.getElementById("message");
    throw new Error(r.status + ": " + (msg ? msg.textContent : r.statusText));
  }
  const doc = new DOMParser().parseFromString(await r.text(), "text/html");
  const main = document.querySelector("main");
  const fresh = doc.querySelector("main");
  if (fresh && main.dataset.key !== fresh.dataset.key) {
    // The page changed shape (a running trial finished): swap it all, keep open sections.
    const open = [...main.querySelectorAll("details[open][id]")].map((d) => d.id);
    main.innerHTML = fresh.innerHTML;
    main.dataset.key = fresh.dataset.key;
    for (const id of open) {
      const d = document.getElementById(id);
      if (d) d.open = true;
    }
    drawEmbedded(main);
  } else {
    for (const el of document.querySelectorAll(".live[id]")) {
      const n = doc.getElementById(el.id);
      if (n && n.innerHTML !== el.innerHTML) el.innerHTML = n.innerHTML;
    }
    for (const src of document.querySelectorAll("script.live-figure[id]")) {
      const n = doc.getElementById(src.id);
      if (!n || n.textContent === src.textContent) continue;
      src.textContent = n.textContent;
      const div = document.querySelector(`[data-figure="${src.id}"]`);
      if (div) {
        const fig = JSON.parse(src.textContent);
        Plotly.react(div, fig.data, fig.layout, PLOT_CONFIG);
      }
    }
  }
  document.body.dataset.refreshes = String(Number(document.body.dataset.refreshes || 0) + 1);
}

async function poll() {
  const live = document.getElementById("live");
  const url = document.body.dataset.stampUrl;
  if (!live || !live.checked || !url) return;
  try {
    const r = await fetch(url, { cache: "no-store" });
    if (!r.ok) {
      showError(r.status + ": " + (await detail(r)));
      return;
    }
    const { stamp } = await r.json();
    if (lastStamp !== null && stamp !== lastStamp) await refresh();
    lastStamp = stamp;
    clearError();
  } catch (e) {
    showError(e instanceof TypeError ? "the dashboard server is unreachable" : String(e.message || e));
  }
}
window.ftPoll = poll; // the browser test polls now instead of waiting POLL_MS

function setupLive() {
  const live = document.getElementById("live");
  if (!live) return;
  live.checked = localStorage.getItem("ft-live") !== "off";
  live.addEventListener("change", () => {
    localStorage.setItem("ft-live", live.checked ? "on" : "off");
  });
  poll();
  setInterval(poll, POLL_MS);
}

document.addEventListener("DOMContentLoaded", () => {
  drawEmbedded(document);
  drawFetched();
  setupLive();
});
