"""Actions on jobs for `gpuq top`: confirm, send to the daemon, report.

`JobActionsApp` is the part of the app that steers jobs; `GpuqTop` adds
the views. Each action applies to `current_job_id()` (the highlighted job,
or the job of the open detail view); destructive ones ask first; the
request runs in a thread worker, and its per-job results come back as
notifications: plain text (`markup=False`), with the daemon's messages,
which may quote a job name, through `gpuq.textsafe.visible`.
"""

from __future__ import annotations

import threading
from typing import Any

from textual import work
from textual.app import App
from textual.message import Message

from gpuq.errors import GpuqError
from gpuq.textsafe import visible
from gpuq.tui.messages import ActionDone, ActionFailed, JobChanged
from gpuq.tui.model import QueueModel
from gpuq.tui.screens import ConfirmScreen, PromptScreen
from gpuq.tui.source import Source


class JobActionsApp(App[None]):
    """An app that can cancel, suspend, resume, hold, release, retry and re-prioritize jobs."""

    source: Source
    model: QueueModel
    _stopping: threading.Event

    def current_job_id(self) -> int | None:
        """The job actions apply to; the app with the views decides."""
        return None

    def _post(self, message: Message) -> None:
        if not self._stopping.is_set():
            self.post_message(message)

    def _act(self, method: str, question: str | None = None, **extra: Any) -> None:
        job_id = self.current_job_id()
        if job_id is None:
            self.notify("No job selected.", severity="warning")
            return
        if question is None:
            self.send_action(method, [job_id], **extra)
            return

        def answered(yes: bool | None) -> None:
            if yes:
                self.send_action(method, [job_id], **extra)

        self.push_screen(ConfirmScreen(question.format(id=job_id), method.title()), answered)

    @work(thread=True, group="actions")
    def send_action(self, method: str, ids: list[int], **extra: Any) -> None:
        """Send one action to the daemon, report its results and show the jobs as they are now.

        Not every change is a state transition the event stream reports (a new
        priority is not), so the jobs are fetched again once the action is done;
        the stream stays the authority on states (see `JobChanged.refreshed`).
        """
        try:
            self._post(ActionDone(method, self.source.act(method, ids, **extra)))
            for job in self.source.jobs(ids):
                self._post(JobChanged(job, refreshed=True))
        except GpuqError as exc:
            self._post(ActionFailed(method, exc.message, exc.hint))

    def on_action_done(self, message: ActionDone) -> None:
        """Say what happened to each job."""
        for result in message.results:
            if result["ok"]:
                self.notify(f"job {result['id']}: {result['state']}", title=message.method)
            else:
                self.notify(
                    visible(result["message"]), title=message.method, severity="error", markup=False
                )

    def on_action_failed(self, message: ActionFailed) -> None:
        """Say why the action was not sent."""
        text = visible(message.message) + (f"\n{visible(message.hint)}" if message.hint else "")
        self.notify(text, title=message.method, severity="error", markup=False)

    def action_cancel_job(self) -> None:
        """Cancel the job (asks first)."""
        self._act("cancel", "Cancel job {id}? A running job is killed.")

    def action_suspend_job(self) -> None:
        """Suspend the running job (asks first)."""
        self._act("suspend", "Suspend job {id}?")

    def action_resume_job(self) -> None:
        """Resume the suspended job."""
        self._act("resume")

    def action_hold_job(self) -> None:
        """Keep the queued job from starting."""
        self._act("hold")

    def action_release_job(self) -> None:
        """Let the held job start."""
        self._act("release")

    def action_retry_job(self) -> None:
        """Queue the ended job again."""
        self._act("retry")

    def action_priority_job(self) -> None:
        """Ask for a new priority for the pending job."""
        job_id = self.current_job_id()
        if job_id is None:
            self.notify("No job selected.", severity="warning")
            return
        current = self.model.jobs.get(job_id, {}).get("priority", 0)

        def chosen(text: str | None) -> None:
            if text is None:
                return
            try:
                value = int(text.strip())
            except ValueError:
                self.notify(
                    f"not a whole number: {text!r}",
                    severity="error",
                    title="priority",
                    markup=False,
                )
                return
            self.send_action("priority", [job_id], priority=value)

        self.push_screen(
            PromptScreen(f"Priority of job {job_id} (higher runs first)", str(current)), chosen
        )
