/* Sortable tables: a button in each column heading orders the rows by the cells' data-sort values
   (numbers numerically, missing values last); aria-sort tells screen readers the order. Without
   JavaScript the tables read the same, unsorted. */
(function () {
  "use strict";

  function key(cell) {
    var raw = cell ? cell.getAttribute("data-sort") : null;
    if (raw === null || raw === "") {
      return null;
    }
    var number = Number(raw);
    return isNaN(number) ? raw.toLowerCase() : number;
  }

  function order(table, index, heading) {
    var body = table.tBodies[0];
    var rows = Array.prototype.slice.call(body.rows);
    var ascending = heading.getAttribute("aria-sort") !== "ascending";
    rows.sort(function (a, b) {
      var x = key(a.cells[index]);
      var y = key(b.cells[index]);
      if (x === null || y === null) {
        return x === y ? 0 : (x === null ? 1 : -1);
      }
      var c = (typeof x === "number" && typeof y === "number") ? x - y : String(x).localeCompare(String(y));
      return ascending ? c : -c;
    });
    Array.prototype.forEach.call(table.tHead.rows[0].cells, function (other) {
      other.removeAttribute("aria-sort");
    });
    heading.setAttribute("aria-sort", ascending ? "ascending" : "descending");
    rows.forEach(function (row) {
      body.appendChild(row);
    });
  }

  Array.prototype.forEach.call(document.querySelectorAll("table.sortable"), function (table) {
    if (!table.tHead || !table.tBodies.length) {
      return;
    }
    Array.prototype.forEach.call(table.tHead.rows[0].cells, function (heading, index) {
      var button = document.createElement("button");
      button.type = "button";
      button.className = "sort";
      button.title = "Sort by this column";
      while (heading.firstChild) {
        button.appendChild(heading.firstChild);
      }
      heading.appendChild(button);
      button.addEventListener("click", function () {
        order(table, index, heading);
      });
    });
  });
})();
