#!/usr/bin/env python3
"""Writes inventory.xlsx beside this script: the small workbook that
crates/collect/tests/spreadsheet.rs reads. Only the standard library (zipfile and XML text);
the output is byte-for-byte the same on every run.

    python3 crates/collect/tests/data/make_inventory_xlsx.py

Sheet 1, `Read me`, is text only. Sheet 2, `GPUs`, has a title row, a blank row, the header
row (row 3) and six rows: two GPUs by UUID (a date cell and a number price), a host count
(text date, `$4,650.00`), and three bad rows (a count of 0, a UUID that is not `GPU-...`, an
`#N/A` formula result in the count column).
"""

import os
import zipfile
from xml.sax.saxutils import escape

HERE = os.path.dirname(os.path.abspath(__file__))

# (kind, value): s = shared string, n = number, d = date (Excel serial, date style), e = error.
TITLE = [[("s", "GPU inventory, lab 3")], []]
HEADER = [("s", h) for h in ["Hostname", "GPU UUID", "Model", "GPUs", "Location", "Team",
                             "Env", "Purchase date", "Purchase price", "Notes"]]
ROWS = [
    [("s", "dgx-01"), ("s", "GPU-11111111-2222-3333-4444-555555555501"),
     ("s", "NVIDIA H100 80GB HBM3"), None, ("s", "lab-3"), ("s", "research"), ("s", "prod"),
     ("d", 45352), ("n", 35040), ("s", "rack 4")],
    [("s", "dgx-01"), ("s", "GPU-11111111-2222-3333-4444-555555555502"),
     ("s", "NVIDIA H100 80GB HBM3"), ("n", 1), ("s", "lab-3"), ("s", "research"), ("s", "prod"),
     ("d", 45352), ("n", 35040), None],
    [("s", "ws-07"), None, ("s", "NVIDIA RTX A6000"), ("n", 2), ("s", "lab-3"), ("s", "vision"),
     ("s", "dev"), ("s", "2023-06-15"), ("s", "$4,650.00"), None],
    [("s", "ws-08"), None, ("s", "NVIDIA RTX A6000"), ("n", 0), ("s", "lab-3"), ("s", "vision"),
     ("s", "dev"), None, None, None],
    [("s", "ws-09"), ("s", "gpu0"), ("s", "NVIDIA RTX A6000"), None, ("s", "lab-3"), None, None,
     None, None, None],
    [("s", "ws-10"), None, ("s", "NVIDIA RTX A6000"), ("e", "#N/A"), ("s", "lab-3"), None, None,
     None, None, None],
]

strings = []


def sst(text):
    if text not in strings:
        strings.append(text)
    return strings.index(text)


def col(i):
    return "ABCDEFGHIJKLMNOPQRSTUVWXYZ"[i]


def sheet_xml(rows):
    out = ['<?xml version="1.0" encoding="UTF-8" standalone="yes"?>',
           '<worksheet xmlns="http://schemas.openxmlformats.org/spreadsheetml/2006/main">',
           "<sheetData>"]
    for r, cells in enumerate(rows, start=1):
        out.append(f'<row r="{r}">')
        for c, cell in enumerate(cells):
            if cell is None:
                continue
            kind, value = cell
            ref = f"{col(c)}{r}"
            if kind == "s":
                out.append(f'<c r="{ref}" t="s"><v>{sst(value)}</v></c>')
            elif kind == "n":
                out.append(f'<c r="{ref}"><v>{value}</v></c>')
            elif kind == "d":
                out.append(f'<c r="{ref}" s="1"><v>{value}</v></c>')
            elif kind == "e":
                out.append(f'<c r="{ref}" t="e"><f>NA()</f><v>{escape(value)}</v></c>')
        out.append("</row>")
    out.append("</sheetData></worksheet>")
    return "".join(out)


def main():
    readme = sheet_xml([[("s", "One row per GPU (with its UUID) or per host (with its count).")]])
    gpus = sheet_xml(TITLE + [HEADER] + ROWS)
    shared = ('<?xml version="1.0" encoding="UTF-8" standalone="yes"?>'
              '<sst xmlns="http://schemas.openxmlformats.org/spreadsheetml/2006/main" '
              f'count="{len(strings)}" uniqueCount="{len(strings)}">'
              + "".join(f"<si><t>{escape(s)}</t></si>" for s in strings) + "</sst>")
    files = {
        "[Content_Types].xml":
            '<?xml version="1.0" encoding="UTF-8" standalone="yes"?>'
            '<Types xmlns="http://schemas.openxmlformats.org/package/2006/content-types">'
            '<Default Extension="rels" ContentType="application/vnd.openxmlformats-package.relationships+xml"/>'
            '<Default Extension="xml" ContentType="application/xml"/>'
            '<Override PartName="/xl/workbook.xml" ContentType="application/vnd.openxmlformats-officedocument.spreadsheetml.sheet.main+xml"/>'
            '<Override PartName="/xl/worksheets/sheet1.xml" ContentType="application/vnd.openxmlformats-officedocument.spreadsheetml.worksheet+xml"/>'
            '<Override PartName="/xl/worksheets/sheet2.xml" ContentType="application/vnd.openxmlformats-officedocument.spreadsheetml.worksheet+xml"/>'
            '<Override PartName="/xl/sharedStrings.xml" ContentType="application/vnd.openxmlformats-officedocument.spreadsheetml.sharedStrings+xml"/>'
            '<Override PartName="/xl/styles.xml" ContentType="application/vnd.openxmlformats-officedocument.spreadsheetml.styles+xml"/>'
            '</Types>',
        "_rels/.rels":
            '<?xml version="1.0" encoding="UTF-8" standalone="yes"?>'
            '<Relationships xmlns="http://schemas.openxmlformats.org/package/2006/relationships">'
            '<Relationship Id="rId1" Type="http://schemas.openxmlformats.org/officeDocument/2006/relationships/officeDocument" Target="xl/workbook.xml"/>'
            '</Relationships>',
        "xl/workbook.xml":
            '<?xml version="1.0" encoding="UTF-8" standalone="yes"?>'
            '<workbook xmlns="http://schemas.openxmlformats.org/spreadsheetml/2006/main" '
            'xmlns:r="http://schemas.openxmlformats.org/officeDocument/2006/relationships">'
            '<sheets><sheet name="Read me" sheetId="1" r:id="rId1"/>'
            '<sheet name="GPUs" sheetId="2" r:id="rId2"/></sheets></workbook>',
        "xl/_rels/workbook.xml.rels":
            '<?xml version="1.0" encoding="UTF-8" standalone="yes"?>'
            '<Relationships xmlns="http://schemas.openxmlformats.org/package/2006/relationships">'
            '<Relationship Id="rId1" Type="http://schemas.openxmlformats.org/officeDocument/2006/relationships/worksheet" Target="worksheets/sheet1.xml"/>'
            '<Relationship Id="rId2" Type="http://schemas.openxmlformats.org/officeDocument/2006/relationships/worksheet" Target="worksheets/sheet2.xml"/>'
            '<Relationship Id="rId3" Type="http://schemas.openxmlformats.org/officeDocument/2006/relationships/sharedStrings" Target="sharedStrings.xml"/>'
            '<Relationship Id="rId4" Type="http://schemas.openxmlformats.org/officeDocument/2006/relationships/styles" Target="styles.xml"/>'
            '</Relationships>',
        "xl/worksheets/sheet1.xml": readme,
        "xl/worksheets/sheet2.xml": gpus,
        "xl/sharedStrings.xml": shared,
        # Style 1 is the built-in date format 14 (m/d/yyyy): a date cell.
        "xl/styles.xml":
            '<?xml version="1.0" encoding="UTF-8" standalone="yes"?>'
            '<styleSheet xmlns="http://schemas.openxmlformats.org/spreadsheetml/2006/main">'
            '<fonts count="1"><font/></fonts><fills count="1"><fill/></fills>'
            '<borders count="1"><border/></borders>'
            '<cellStyleXfs count="1"><xf numFmtId="0"/></cellStyleXfs>'
            '<cellXfs count="2"><xf numFmtId="0"/><xf numFmtId="14" applyNumberFormat="1"/></cellXfs>'
            '</styleSheet>',
    }
    path = os.path.join(HERE, "inventory.xlsx")
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for name, text in files.items():
            info = zipfile.ZipInfo(name, date_time=(2026, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(info, text.encode("utf-8"))
    print(path)


if __name__ == "__main__":
    main()
