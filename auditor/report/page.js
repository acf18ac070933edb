(function () {
  var status = document.getElementById('auditor-render-status');
  var figs = JSON.parse(document.getElementById('auditor-figures').textContent);
  var config = __CONFIG__;
  var drawn = {};
  function record(id, gd) {
    var traces = (gd.data || []).map(function (t) {
      var n = 0;
      if (t.z) { t.z.forEach(function (row) { n += (row || []).length; }); }
      else if (t.y) { n = t.y.length; }
      return {name: t.name || '', points: n};
    });
    drawn[id] = {traces: traces, svg: gd.querySelectorAll('svg.main-svg').length,
                 drawnTraces: gd.querySelectorAll('.trace, .hm, image').length};
  }
  var jobs = figs.map(function (f) {
    var el = document.getElementById(f.id);
    return Plotly.newPlot(el, f.figure.data, f.figure.layout, config).then(function (gd) {
      record(f.id, gd);
    });
  });
  Promise.all(jobs).then(function () {
    status.setAttribute('data-rendered', String(Object.keys(drawn).length));
    status.textContent = JSON.stringify(drawn);
  }, function (err) {
    status.setAttribute('data-error', String(err));
  });
})();
