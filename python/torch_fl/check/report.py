"""Output formats of ``torch_fl check``: text, JSON and SARIF 2.1.0."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from .rules import RULES, RULES_BY_ID

if TYPE_CHECKING:
    from .engine import Finding

SARIF_SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"
TOOL_URI = "https://github.com/torch-fl/torch-fl/blob/main/docs/check-rules.md"


def text(findings: Sequence[Finding]) -> str:
    """One ``path:line:column: RULE message`` line per finding, with the rewrite on the next line."""
    lines = []
    for f in findings:
        lines.append(f"{f.path}:{f.line}:{f.column}: {f.rule} {f.message}")
        label = "fix" if f.fixable else "use"
        lines.append(f"    {label}: {f.replacement}")
    return "\n".join(lines)


def summary(findings: Sequence[Finding], files: int) -> str:
    """The last line of the text format."""
    fixable = sum(f.fixable for f in findings)
    if not findings:
        return f"checked {files} file(s): no CUDA-only constructs"
    return f"checked {files} file(s): {len(findings)} CUDA-only construct(s), {fixable} fixable with --fix"


def as_json(findings: Sequence[Finding]) -> str:
    """A JSON list of finding objects (path, line, column, rule, message, replacement, ...)."""
    return json.dumps([f.to_dict() for f in findings], indent=2)


def sarif(findings: Sequence[Finding]) -> str:
    """A SARIF 2.1.0 log with one run: the rule table and one result per finding."""
    index = {rule.id: i for i, rule in enumerate(RULES)}
    rules = [
        {
            "id": rule.id,
            "name": rule.name,
            "shortDescription": {"text": rule.what},
            "fullDescription": {"text": rule.why},
            "help": {"text": f"Rewrite: {rule.rewrite}"},
            "helpUri": f"{TOOL_URI}#{rule.id.lower()}",
            "properties": {"fixable": rule.fixable},
        }
        for rule in RULES
    ]
    results = []
    for f in findings:
        results.append(
            {
                "ruleId": f.rule,
                "ruleIndex": index[f.rule],
                "level": "error" if f.rule == "FL000" else "warning",
                "message": {"text": f"{f.message}. {'Fix' if f.fixable else 'Use'}: {f.replacement}"},
                "locations": [
                    {
                        "physicalLocation": {
                            "artifactLocation": {"uri": Path(f.path).as_posix()},
                            "region": {
                                "startLine": f.line,
                                "startColumn": f.column,
                                "endLine": f.end_line,
                                "endColumn": f.end_column,
                            },
                        }
                    }
                ],
                "properties": {"name": RULES_BY_ID[f.rule].name, "replacement": f.replacement, "fixable": f.fixable},
            }
        )
    log = {
        "$schema": SARIF_SCHEMA,
        "version": "2.1.0",
        "runs": [
            {
                "tool": {"driver": {"name": "torch-fl check", "informationUri": TOOL_URI, "rules": rules}},
                "results": results,
            }
        ],
    }
    return json.dumps(log, indent=2)
