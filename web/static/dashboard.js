// KernelFleet dashboard: draws the server-built Plotly figures and sends admin actions.
(function () {
  "use strict";

  function drawCharts() {
    if (typeof Plotly === "undefined") return;
    document.querySelectorAll("div.chart").forEach(function (div) {
      var script = div.nextElementSibling;
      if (!script || !script.classList.contains("figure")) return;
      var fig = JSON.parse(script.textContent);
      Plotly.newPlot(div, fig.data, fig.layout, {
        responsive: true, displaylogo: false,
        modeBarButtonsToRemove: ["select2d", "lasso2d", "autoScale2d"],
      }).then(function () {
        div.setAttribute("data-ready", "1");
      });
      // A click on a run's marker opens that run (all its trials).
      div.on("plotly_click", function (ev) {
        var pt = ev.points && ev.points[0];
        if (pt && Array.isArray(pt.customdata) && Number.isInteger(pt.customdata[0])) {
          window.location.href = "/runs/" + pt.customdata[0];
        }
      });
    });
  }

  function wireAcknowledge() {
    document.querySelectorAll("form.ack").forEach(function (form) {
      form.addEventListener("submit", function (ev) {
        ev.preventDefault();
        var token = form.querySelector("input[name=token]").value.trim();
        var note = form.querySelector("input[name=note]").value;
        var group = form.querySelector("input[name=whole_group]");
        var out = form.querySelector(".ack-result");
        var saved = window.sessionStorage.getItem("kernelfleet-admin-token");
        if (!token && saved) token = saved;
        if (!token) { out.textContent = "Enter the admin token first."; out.className = "ack-result flash bad"; return; }
        fetch(form.getAttribute("data-url"), {
          method: "POST",
          headers: { "Authorization": "Bearer " + token, "Content-Type": "application/json" },
          body: JSON.stringify({ note: note || null, whole_group: !!(group && group.checked) }),
        }).then(function (resp) {
          return resp.json().catch(function () { return {}; }).then(function (body) {
            if (resp.ok) {
              window.sessionStorage.setItem("kernelfleet-admin-token", token);
              var n = (body && body.acknowledged) ? body.acknowledged.length : 1;
              out.textContent = "Acknowledged " + n + (n === 1 ? " regression." : " regressions.");
              out.className = "ack-result flash good";
              window.setTimeout(function () { window.location.reload(); }, 400);
            } else {
              out.textContent = (body && body.detail) ? String(body.detail) : ("Failed: HTTP " + resp.status);
              out.className = "ack-result flash bad";
            }
          });
        }).catch(function (err) {
          out.textContent = "Could not reach the coordinator: " + err;
          out.className = "ack-result flash bad";
        });
      });
      var saved = window.sessionStorage.getItem("kernelfleet-admin-token");
      if (saved) form.querySelector("input[name=token]").placeholder = "admin token (remembered)";
    });
  }

  // Progress bar segments carry their width as data (the CSP allows no inline style attributes).
  function sizeSegments() {
    document.querySelectorAll(".seg[data-width]").forEach(function (seg) {
      seg.style.width = seg.getAttribute("data-width") + "%";
    });
  }

  // A select that clears other fields of its form, then submits it (e.g. a new chip on /compare).
  function wireResets() {
    document.querySelectorAll("select[data-resets]").forEach(function (select) {
      select.addEventListener("change", function () {
        select.getAttribute("data-resets").split(" ").forEach(function (name) {
          var field = select.form.elements[name];
          if (field) field.value = "";
        });
        select.form.submit();
      });
    });
  }

  sizeSegments();
  wireResets();
  drawCharts();
  wireAcknowledge();
})();
