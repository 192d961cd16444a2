// gpuledger's pages: served as /static/sort.js (the content security policy allows no inline
// script).
// Click a column header to sort the rows shown (numbers by value, text alphabetically);
// MIG rows stay under their GPU.
document.querySelectorAll('table.sortable th').forEach(function (th, _) {
  th.addEventListener('click', function () {
    var table = th.closest('table'), i = Array.prototype.indexOf.call(th.parentNode.children, th);
    var body = table.tBodies[0], groups = [], cur = null;
    Array.prototype.forEach.call(body.rows, function (r) {
      if (r.classList.contains('child') && cur) { cur.push(r); } else { cur = [r]; groups.push(cur); }
    });
    var dir = th.dataset.dir === 'asc' ? -1 : 1; th.dataset.dir = dir === 1 ? 'asc' : 'desc';
    function key(r) { var c = r.cells[i]; if (!c) return ''; var s = c.dataset.sort; return s !== undefined ? parseFloat(s) : c.textContent.trim().toLowerCase(); }
    groups.sort(function (a, b) { var x = key(a[0]), y = key(b[0]); return (x < y ? -1 : x > y ? 1 : 0) * dir; });
    groups.forEach(function (g) { g.forEach(function (r) { body.appendChild(r); }); });
  });
});
