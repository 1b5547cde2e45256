"""Write the params entries of src/gpubench/schemas/result-v1.schema.json from gpubench's own
plug-ins' ``params_schema`` (``make schema``), keeping the rest of the file as it is written.

tests/unit/test_result_schema.py holds the file to the descriptors; run this after changing one.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

FILE = Path(__file__).resolve().parents[1] / "src" / "gpubench" / "schemas" / "result-v1.schema.json"


def entry_text(e: dict) -> str:
    """One entry, one param a line, in the file's own compact style."""
    params = e["then"]["properties"]["records"]["items"]["properties"]["params"]
    props = list(params["properties"].items())
    lines = [
        f'    {{"$comment": {json.dumps(e["$comment"])},',
        f'     "if": {{"properties": {{"command": {{"const": {json.dumps(e["if"]["properties"]["command"]["const"])}}}}}, '
        '"required": ["command"]},',
        '     "then": {"properties": {"records": {"items": {"properties": {"params": {',
        f'       "type": "object", "required": {json.dumps(params["required"])}, "additionalProperties": false,',
        '       "properties": {' + ("" if props else "}}}}}}}}"),
    ]
    for i, (k, v) in enumerate(props):
        lines.append(f"         {json.dumps(k)}: {json.dumps(v, ensure_ascii=False)}{',' if i < len(props) - 1 else ''}")
    if props:
        lines.append("       }}}}}}}}")
    return "\n".join(lines)


def main() -> int:
    from gpubench.core import registry
    from gpubench.core.result import PARAMS_COMMENT, schema_with

    own = [p for p in registry.plugins().values() if p.command.startswith("gpubench.")]
    made = schema_with(own)
    text = FILE.read_text(encoding="utf-8")
    start = text.index('  "allOf": [\n') + len('  "allOf": [\n')
    end = text.index("\n  ],\n", start)
    kept = [e for e in made["allOf"] if not e.get("$comment", "").startswith(PARAMS_COMMENT)]
    # the entries that are not params entries are the file's own text: keep it up to the first params entry
    body = text[start:end]
    m = re.search(r',\n    \{"\$comment": "' + re.escape(PARAMS_COMMENT), body)
    own_text = body[:m.start()] if m else body
    assert json.loads("[" + own_text + "]") == kept, "the file's own allOf entries changed: edit them by hand"
    new = own_text + ",\n" + ",\n".join(entry_text(e) for e in made["allOf"][len(kept):])
    out = text[:start] + new + text[end:]
    assert json.loads(out) == made
    FILE.write_text(out, encoding="utf-8")
    print(f"wrote {FILE.relative_to(Path.cwd()) if FILE.is_relative_to(Path.cwd()) else FILE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
