"""Draw the session state diagram from the transition tables (Graphviz dot).

``python -m turnledger.sessions._diagram > states.dot``
"""

from __future__ import annotations

from ._machine import EVENT_TRANSITIONS


def state_diagram() -> str:
    """The phases and the events that move between them, as dot source."""
    lines = ["digraph session {", "  rankdir=LR;"]
    for source, row in EVENT_TRANSITIONS.items():
        for event, target in row.items():
            if target is not None and target is not source:
                lines.append(
                    f'  "{source.__name__}" -> "{target.__name__}" [label="{event.__name__}"];'
                )
    lines.append("}")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(state_diagram(), end="")
