// fleettune dashboard: draw the plotly figures embedded in the page, load the ones served by
// the API, and reload the page when /api/stamp says something changed (live refresh).
"use strict";

const PLOT_CONFIG = { displaylogo: false, responsive: true };

function draw(div, fig) {
  return Plotly.newPlot(div, fig.data, fig.layout, PLOT_CONFIG);
}

function drawEmbedded() {
  for (const div of document.querySelectorAll("[data-figure]")) {
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
        p.textContent = "parameter importances: " + (body.error || body.detail || "none");
        div.appendChild(p);
      }
      div.dataset.loaded = "1";
    } catch (e) {
      div.textContent = "could not load " + div.dataset.src + ": " + e;
    }
  }
}

let lastStamp = null;

async function poll() {
  const live = document.getElementById("live");
  const url = document.body.dataset.stampUrl;
  if (!live || !live.checked || !url) return;
  try {
    const r = await fetch(url);
    if (!r.ok) return;
    const { stamp } = await r.json();
    if (lastStamp !== null && stamp !== lastStamp) {
      sessionStorage.setItem("ft-scroll", String(window.scrollY));
      location.reload();
      return;
    }
    lastStamp = stamp;
    document.getElementById("refreshed").textContent =
      "checked " + new Date().toLocaleTimeString();
  } catch (e) {
    document.getElementById("refreshed").textContent = "server unreachable";
  }
}

function setupLive() {
  const live = document.getElementById("live");
  if (!live) return;
  live.checked = localStorage.getItem("ft-live") !== "off";
  live.addEventListener("change", () => {
    localStorage.setItem("ft-live", live.checked ? "on" : "off");
  });
  const y = sessionStorage.getItem("ft-scroll");
  if (y !== null) {
    sessionStorage.removeItem("ft-scroll");
    window.scrollTo(0, Number(y));
  }
  poll();
  setInterval(poll, 5000);
}

document.addEventListener("DOMContentLoaded", () => {
  drawEmbedded();
  drawFetched();
  setupLive();
});
