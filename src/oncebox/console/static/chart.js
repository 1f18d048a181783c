// The overview's chart (uPlot, vendored): backlog and messages waiting, and jobs completed and
// messages sent per minute, from the console's own samples (/trends.json). Redrawn every minute.
(function () {
  const box = document.getElementById("trend");
  if (!box || typeof uPlot === "undefined") return;
  let plot = null;
  function draw(data) {
    const columns = [data.t, data.ready, data.pending, data.completed_per_min, data.sent_per_min];
    if (data.t.length < 2) {
      box.textContent = "Collecting samples: the chart starts after two minutes.";
      return;
    }
    const options = {
      width: Math.max(box.clientWidth, 400),
      height: 260,
      scales: { x: { time: true }, count: { auto: true }, rate: { auto: true } },
      axes: [{}, { scale: "count", label: "waiting" }, { scale: "rate", side: 1, label: "per minute", grid: { show: false } }],
      series: [
        {},
        { label: "jobs ready", scale: "count", stroke: "#2b59c3", width: 2 },
        { label: "messages pending", scale: "count", stroke: "#9a6200", width: 2 },
        { label: "completed / min", scale: "rate", stroke: "#1f7a3d", width: 2 },
        { label: "sent / min", scale: "rate", stroke: "#7a3d9a", width: 2 },
      ],
    };
    if (plot) plot.destroy();
    box.textContent = "";
    plot = new uPlot(options, columns, box);
  }
  function load() {
    fetch(box.dataset.src, { credentials: "same-origin" })
      .then((r) => (r.ok ? r.json() : Promise.reject(r.status)))
      .then(draw)
      .catch(() => { box.textContent = "The chart's samples could not be read."; });
  }
  load();
  setInterval(load, 60000);
})();
