"""``python -m reports.docs``: regenerate reports/VIEWS.md from the view definitions."""

from __future__ import annotations

from pathlib import Path

from ._views import views_markdown

PATH = Path(__file__).with_name("VIEWS.md")


def main() -> None:
    PATH.write_text(views_markdown(), encoding="utf-8")
    print(f"wrote {PATH}")


if __name__ == "__main__":
    main()
