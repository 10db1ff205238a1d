"""Modal screens of `gpuq top`: confirm, prompt for a value, key help."""

from __future__ import annotations

from collections.abc import Iterable

from rich.table import Table
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label, Static

MODAL_CSS = """
.dialog {
    width: 64; height: auto; max-height: 90%; padding: 1 2;
    border: thick $primary; background: $surface;
}
.dialog .title { text-style: bold; margin-bottom: 1; }
.dialog .error { color: $error; }
.dialog Horizontal { height: auto; align-horizontal: right; margin-top: 1; }
.dialog Button { margin-left: 1; }
"""


class ConfirmScreen(ModalScreen[bool]):
    """Ask before a destructive action; `y`/Enter confirms, `n`/Escape cancels."""

    DEFAULT_CSS = "ConfirmScreen { align: center middle; }\n" + MODAL_CSS
    BINDINGS = [
        Binding("y", "answer(True)", "Yes"),
        Binding("n,escape", "answer(False)", "No"),
    ]

    def __init__(self, question: str, confirm_label: str = "Yes") -> None:
        super().__init__()
        self.question = question
        self.confirm_label = confirm_label

    def compose(self) -> ComposeResult:
        """A question and two buttons."""
        with Vertical(classes="dialog"):
            yield Label(self.question, classes="title")
            with Horizontal():
                yield Button("No (n)", id="no")
                yield Button(f"{self.confirm_label} (y)", id="yes", variant="error")

    def on_mount(self) -> None:
        """Focus the safe answer."""
        self.query_one("#no", Button).focus()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        """A click answers."""
        self.dismiss(event.button.id == "yes")

    def action_answer(self, answer: bool) -> None:
        """A key answers."""
        self.dismiss(answer)


class PromptScreen(ModalScreen[str | None]):
    """Ask for one value (a priority, a filter); Enter submits, Escape cancels."""

    DEFAULT_CSS = "PromptScreen { align: center middle; }\n" + MODAL_CSS
    BINDINGS = [Binding("escape", "cancel", "Cancel")]

    def __init__(self, title: str, value: str = "", placeholder: str = "", help_text: str = ""):
        super().__init__()
        self.title_text = title
        self.value = value
        self.placeholder = placeholder
        self.help_text = help_text

    def compose(self) -> ComposeResult:
        """A title, an input and an optional help line."""
        with Vertical(classes="dialog"):
            yield Label(self.title_text, classes="title")
            yield Input(value=self.value, placeholder=self.placeholder, id="value")
            if self.help_text:
                yield Label(self.help_text)
            yield Label("", id="error", classes="error")

    def on_input_submitted(self, event: Input.Submitted) -> None:
        """Enter submits the value."""
        self.dismiss(event.value)

    def show_error(self, text: str) -> None:
        """Say why the value was refused (the screen stays open)."""
        self.query_one("#error", Label).update(text)

    def action_cancel(self) -> None:
        """Escape closes without a value."""
        self.dismiss(None)


def binding_rows(bindings: Iterable[BindingType]) -> list[tuple[str, str]]:
    """(keys, description) for each shown binding, as the help screen lists them."""
    rows = []
    for binding in bindings:
        if isinstance(binding, Binding) and binding.description:
            keys = binding.key_display or binding.key.replace(",", " / ")
            rows.append((keys, binding.description))
    return rows


class HelpScreen(ModalScreen[None]):
    """Every key of the main view and the detail view, built from their bindings."""

    DEFAULT_CSS = (
        "HelpScreen { align: center middle; }\n" + MODAL_CSS + "HelpScreen .dialog { width: 72; }\n"
    )
    BINDINGS = [Binding("escape,q,question_mark", "close", "Close")]

    def __init__(self, sections: dict[str, list[tuple[str, str]]]) -> None:
        super().__init__()
        self.sections = sections

    def compose(self) -> ComposeResult:
        """One table of keys per view."""
        with VerticalScroll(classes="dialog"):
            yield Label("gpuq top: keys", classes="title")
            for title, rows in self.sections.items():
                table = Table(title=title, title_justify="left", show_header=False, box=None)
                table.add_column(style="bold cyan", no_wrap=True)
                table.add_column()
                for keys, description in rows:
                    table.add_row(keys, description)
                yield Static(table)
            yield Static(
                "Filter syntax: state:running,queued user:ana name:bert gpus:2 free words. "
                "Ctrl+P opens the command palette; the mouse selects rows and sorts by header."
            )

    def action_close(self) -> None:
        """Close the help."""
        self.dismiss(None)
