"""Tests of sglab.tools, and what they share."""


def outputs_text(nb) -> str:
    """All text outputs of an executed notebook, cell by cell (for failure messages)."""
    parts = []
    for i, c in enumerate(nb.cells):
        for out in c.get("outputs", []) if c.cell_type == "code" else []:
            if out.get("output_type") == "stream":
                parts.append(f"[cell {i} {out.get('name')}] {out.get('text', '')}")
            elif out.get("output_type") == "error":
                parts.append(f"[cell {i} error] {out.get('ename')}: {out.get('evalue')}\n" +
                             "\n".join(out.get("traceback", [])))
            elif "text/plain" in out.get("data", {}):
                parts.append(f"[cell {i} result] {out['data']['text/plain']}")
    return "\n".join(parts)
