// The matrix page's behaviour: filters (case/cell text, verdict), the skipped squares' toggle, and the details
// panel of a clicked square, built from the JSON in #details-data (reports/html_details.py). A link can pre-set
// them: matrix.html?cell=ct-llama&verdict=fail&skip=hide&open=<cell id>@<GPU class> (or the same after #).
const text = document.getElementById("filter-text"), verdict = document.getElementById("filter-verdict");
const showSkip = document.getElementById("show-skip"), panel = document.getElementById("details");
const data = JSON.parse(document.getElementById("details-data").textContent);

function applyFilter() {
  const t = text.value.trim(), v = verdict.value;
  for (const row of document.querySelectorAll("#matrix tbody tr")) {
    const okText = !t || row.dataset.cell.includes(t);
    const okVerdict = !v || row.dataset.verdicts.split(" ").includes(v);
    row.hidden = !(okText && okVerdict);
  }
  for (const grid of document.querySelectorAll("#grids .grid-case")) {
    let any = false;
    for (const sq of grid.querySelectorAll("td.sq")) {
      const ok = (!t || sq.dataset.cell.includes(t)) && (!v || sq.classList.contains(v));
      sq.classList.toggle("off", !ok);
      any = any || ok;
    }
    grid.hidden = !any;
  }
}

function applySkip() {
  document.body.classList.toggle("hide-skip", !showSkip.checked);
}

function esc(value) {
  const s = value === null || value === undefined ? "" : String(value);
  return s.replace(/[&<>"]/g, (c) => ({"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;"})[c]);
}

function table(id, columns, rows) {
  if (!rows || !rows.length) return "";
  const head = columns.map((c) => `<th>${esc(c)}</th>`).join("");
  const body = rows.map((r) => `<tr>${r.map((x) => `<td>${esc(x)}</td>`).join("")}</tr>`).join("");
  return `<table class="${id}"><thead><tr>${head}</tr></thead><tbody>${body}</tbody></table>`;
}

function shared(ref) {
  return ref === undefined ? [] : data.tables[ref];
}

function show(sq) {
  const r = data.records[+sq.dataset.i];
  for (const old of document.querySelectorAll("td.sq.selected")) old.classList.remove("selected");
  sq.classList.add("selected");
  const expectations = shared(r.E).map((e) =>
    `<tr><td class="${e[1] ? "ok-yes" : "ok-no"}">${e[1] ? "ok" : "not ok"}</td><td>${esc(e[0])}</td><td>${esc(e[2])}</td></tr>`
  ).join("");
  const links = [r.log ? `<a class="log" href="${esc(r.log)}">log</a>` : "",
                 r.finding ? `<a class="finding" href="${esc(r.finding)}">findings page</a>` : ""].filter(Boolean);
  panel.innerHTML =
    `<button class="close" type="button">close</button>` +
    `<h2 class="details-title">${esc(sq.dataset.cell)} on ${esc(r.gpu)}</h2>` +
    `<p><span class="verdict ${esc(r.v)}">${esc(r.v.toUpperCase())}</span> ${esc(r.reason)}</p>` +
    (r.facts ? `<p class="facts">${esc(r.facts)}</p>` : "") +
    (links.length ? `<p>${links.join(" · ")}</p>` : "") +
    (r.known ? `<h3>Known vLLM failure</h3><p class="known"><a href="${esc(r.known.page || r.known.link)}">${esc(r.known.link)}</a>, known by kvmatrix's ${esc(r.known.source)}. To expect it in this case:</p><pre class="known-rule">${esc(r.known.rule)}</pre>` : "") +
    (r.H ? `<h3>History</h3>` + table("history", ["run", "verdict", "resolved", "vs night before"], r.H.map((h) => [data.runs[h[0]], h[1], h[2], h[3]])) : "") +
    `<h3>Layers</h3>` + (table("layers", data.columns.L, shared(r.L)) || "<p>none recorded</p>") +
    (r.G !== undefined ? `<h3>KV-cache groups</h3>` + table("kv-groups", data.columns.G, shared(r.G)) : "") +
    (r.B !== undefined ? `<h3>Builders</h3>` + table("builders", data.columns.B, shared(r.B)) : "") +
    (expectations ? `<h3>Expectations</h3><table class="expectations"><tbody>${expectations}</tbody></table>` : "") +
    (r.tail ? `<h3>Error</h3><pre class="error-tail">${esc(r.tail)}</pre>` : "");
  panel.hidden = false;
  panel.querySelector(".close").addEventListener("click", () => { panel.hidden = true; sq.classList.remove("selected"); });
}

document.getElementById("grids").addEventListener("click", (event) => {
  const sq = event.target.closest("td.sq");
  if (sq) show(sq);
});
text.addEventListener("input", applyFilter);
verdict.addEventListener("change", applyFilter);
showSkip.addEventListener("change", applySkip);

const preset = new URLSearchParams(location.search || location.hash.slice(1));
text.value = preset.get("cell") || "";
verdict.value = preset.get("verdict") || "";
if (preset.get("skip") === "hide" && showSkip.checked) showSkip.click();
applyFilter();
applySkip();
const open = preset.get("open");
if (open) {
  const at = open.lastIndexOf("@"), cell = open.slice(0, at), gpu = open.slice(at + 1);
  const sq = [...document.querySelectorAll("td.sq")].find((s) => s.dataset.cell === cell && data.records[+s.dataset.i].gpu === gpu);
  if (sq) sq.click();
}
