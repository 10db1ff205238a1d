"""Generate the gpuq man pages from the typer command tree.

`python -m gpuq.cli.manpages [--out DIR]` writes `gpuq.1` and one
`gpuq-<command>.1` per command and subcommand (`gpuq-daemon-start.1`).
`--check` writes nothing: it exits 1 and names every page that differs from
what would be generated, so CI catches a help text changed without the pages.

Names, synopses, descriptions and options come from the commands themselves
(the same text as `--help`); the environment from `gpuq.env`; the exit
statuses from `gpuq.errors.ExitCode`. What the tree cannot say lives in the
tables below: examples (every command must have one, or generation fails)
and the meaning of each exit status. The output is deterministic: no dates
and no paths, only `gpuq.__version__`.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import typer
from typer._click import Command, Context
from typer.core import TyperArgument, TyperGroup, TyperOption

from gpuq import __version__
from gpuq import env as job_env
from gpuq.errors import ExitCode

EXIT_STATUS: dict[ExitCode, str] = {
    ExitCode.OK: "Success.",
    ExitCode.FAILURE: "A generic failure; for gpuq doctor, a check failed.",
    ExitCode.USAGE: "A bad command line, option value, configuration file or request.",
    ExitCode.NOT_FOUND: "No such job.",
    ExitCode.CONFLICT: "The job's state does not allow the action (cancelling a finished job, "
    "releasing a job that is not held); with several ids, the action failed for at least "
    "one of them (3 if every failure was an unknown job), and each failure is printed on "
    "standard error.",
    ExitCode.UNAVAILABLE: "The daemon cannot be reached or started, or the request can never "
    "be met by this server (more GPUs or GPU memory than it has).",
    ExitCode.PROTOCOL: "The client and the daemon speak different protocol versions, or a "
    "message was malformed.",
    ExitCode.STATE: "The state directory or database is unusable (for example on NFS, "
    "read-only, full, or a corrupt database), also when it keeps a daemon this command "
    "starts from starting.",
    ExitCode.TIMEOUT: "A wait ran out of time (--timeout).",
    ExitCode.PERMISSION: "Not allowed: on a lab daemon, another user's job, or an action for "
    "the lab's admins only.",
}
"""What each exit status of `gpuq` means (EXIT STATUS of every page)."""

EXIT_STATUS_NOTES: dict[str, str] = {
    "wait": "When a job did not succeed, the exit status is the job's own exit code (the "
    "largest among the jobs; 1 for a job that ended without one), so it may be any number.",
    "submit": "With --wait, the exit status is the job's own exit code when it did not "
    "succeed (the largest among array tasks; 1 for a job that ended without one).",
}
"""Extra EXIT STATUS text for commands that pass a job's exit code through."""

NOTIFY_ENVIRONMENT: dict[str, str] = {
    job_env.JOB_ID: "The job's id.",
    job_env.JOB_NAME: "The job's name.",
    "GPUQ_JOB_STATE": "The state the job ended in: succeeded, failed, cancelled or lost.",
    "GPUQ_JOB_EXIT_CODE": "The job's exit code; empty when it has none.",
}
"""Variables set for a job's `--notify` command, on top of the job's environment."""

ROOT_DESCRIPTION = (
    "gpuq talks to a per-user daemon over a Unix socket; the first gpuq command starts it "
    "if none runs. The daemon owns all state. Each job runs under a small supervisor in its "
    "own session, so jobs survive a restart of the daemon, which re-adopts them.",
    "Results go to standard output and everything else (errors, each with a hint) to "
    "standard error. With --json, standard output is one JSON document with a "
    "schema_version, and an error is a JSON object on standard error; the schema is "
    "documented in docs/json-schema.md.",
    "Each command has its own page, named gpuq-COMMAND, such as gpuq-submit(1).",
)

EXAMPLES: dict[str, tuple[tuple[str, str], ...]] = {
    "": (
        (
            "Queue a training run on one GPU and follow its output:",
            "gpuq submit -- python train.py --lr 3e-4\ngpuq logs -f 1",
        ),
        (
            "Run a second job only after the first one succeeded:",
            "id=$(gpuq submit -q -- python prep.py)\ngpuq submit --after $id -- python train.py",
        ),
        ("See the queue and the GPUs:", "gpuq ls\ngpuq gpus"),
    ),
    "ls": (
        ("The queue: pending and running jobs.", "gpuq ls"),
        ("Every job, finished ones included.", "gpuq ls -a"),
        ("Every task of array 32.", "gpuq ls 32"),
        ("The ids of failed jobs, for a script.", "gpuq ls -s failed --json | jq '.jobs[].id'"),
    ),
    "show": (
        ("A job's spec, GPUs, timings and history.", "gpuq show 42"),
        ("Why a job is still queued.", "gpuq show 42 --json | jq -r .job.reason"),
    ),
    "metrics": (
        ("What a training job reported: step time, throughput, memory.", "gpuq metrics 42"),
        (
            "The newest step time, for a script.",
            "gpuq metrics 42 -n 1 --json | jq '.samples[-1].step_seconds'",
        ),
    ),
    "logs": (
        ("A job's output so far.", "gpuq logs 42"),
        ("The last 20 lines, then follow until the job ends.", "gpuq logs -f --tail 20 42"),
        ("The job's standard error.", "gpuq logs --stderr 42"),
    ),
    "cancel": (
        ("Cancel two jobs.", "gpuq cancel 42 43"),
        ("Cancel a running job and wait until it has ended.", "gpuq cancel --wait 42"),
        ("Cancel every task of array 32 (the id the submit printed).", "gpuq cancel 32"),
        ("Cancel every queued job.", "gpuq cancel $(gpuq ls -s queued --json | jq '.jobs[].id')"),
    ),
    "hold": (("Keep a queued job from starting.", "gpuq hold 42"),),
    "release": (
        (
            "Submit a job held, then let it start.",
            "gpuq submit --hold -- python train.py\ngpuq release 42",
        ),
    ),
    "retry": (
        ("Run a failed job again under its own id.", "gpuq retry 42"),
        ("Retry every failed job.", "gpuq retry $(gpuq ls -s failed --json | jq '.jobs[].id')"),
    ),
    "suspend": (("Pause a running job.", "gpuq suspend 42"),),
    "resume": (("Continue a suspended job.", "gpuq resume 42"),),
    "migrate": (
        ("Move job 42 to the server gpu2 (checkpoint, copy, resume).", "gpuq migrate 42 --to gpu2"),
        ("The GPUs it goes to, for a script.", "gpuq migrate --json 42 --to gpu2"),
    ),
    "priority": (("Move two queued jobs ahead of the others.", "gpuq priority 10 42 43"),),
    "audit": (
        ("What happened in the last hour, on a lab daemon.", "gpuq audit --since 1h"),
        ("An admin reads one user's entries, for a script.", "gpuq audit --json --user alice"),
    ),
    "share": (
        ("Who has used how much, and whose jobs go next.", "gpuq share"),
        ("The factors, for a script.", "gpuq share --json | jq '.users[] | {user, factor}'"),
    ),
    "lab": (("Set up the lab daemon on a server.", "sudo gpuq lab install --admin @gpuadmin"),),
    "lab install": (
        (
            "Install, start and check the lab daemon.",
            "sudo gpuq lab install --admin @gpuadmin\n"
            "sudo systemctl daemon-reload && sudo systemctl enable --now gpuq\n"
            "gpuq doctor --config /etc/gpuq/config.toml",
        ),
        ("Write the files into a package's staging tree.", "gpuq lab install --root pkgroot"),
    ),
    "wait": (
        ("Wait for two jobs and act on the result.", "gpuq wait 42 43 && echo all succeeded"),
        (
            "Wait for the first of two jobs, at most two hours.",
            "gpuq wait --any --timeout 2h 42 43",
        ),
        (
            "Tell gpuq's own errors from the jobs' exit codes: exit 0 when they ended, "
            "each job's outcome in the JSON.",
            "gpuq wait --exit-zero --json 42 | jq '.jobs[] | {id, state, exit_code}'",
        ),
    ),
    "gpus": (
        ("Every GPU, its memory by owner, and its jobs.", "gpuq gpus"),
        (
            "Free memory per GPU, for a script.",
            "gpuq gpus --json | jq '.gpus[] | {index, memory_free}'",
        ),
    ),
    "top": (
        ("Watch the GPUs and the queue; ? lists the keys, q quits.", "gpuq top"),
        (
            "A server with many GPUs: one line each, sampled every 2 seconds.",
            "gpuq top --compact -i 2",
        ),
    ),
    "clean": (
        ("Forget jobs that ended more than a week ago.", "gpuq clean --older-than 7d"),
        ("See what would go.", "gpuq clean --dry-run"),
    ),
    "doctor": (
        ("Check the set-up.", "gpuq doctor"),
        (
            "Only the checks that are not ok.",
            "gpuq doctor --json | jq '.checks[] | select(.status != \"ok\")'",
        ),
    ),
    "cluster": (
        ("Check every server of the config.", "gpuq cluster ls"),
        ("Add a server, checked first.", "gpuq cluster add gpu2 --label a100"),
    ),
    "cluster add": (
        ("Add a server of your ssh config, with a label.", "gpuq cluster add gpu2 --label a100"),
        (
            "Where gpuq is not on the PATH of ssh commands there.",
            "gpuq cluster add gpu3 --command /opt/gpuq/bin/gpuq",
        ),
    ),
    "cluster remove": (("Take gpu2 out of the config.", "gpuq cluster remove gpu2"),),
    "cluster ls": (
        ("Check every server now.", "gpuq cluster ls"),
        (
            "The servers that are down, in a script.",
            "gpuq cluster ls --json | jq -r '.servers[] | select(.up | not) | .host'",
        ),
    ),
    "bridge": (
        (
            "Check that a head can reach the daemon on gpu2 (prints its handshake).",
            'echo \'{"id": 0, "method": "hello", "params": {"version": 1}}\' '
            "| ssh -o BatchMode=yes gpu2 gpuq bridge",
        ),
    ),
    "submit": (
        ("Queue a job on one GPU.", "gpuq submit -- python train.py --epochs 10"),
        (
            "Two GPUs, a 12-hour limit and a name.",
            "gpuq submit -g 2 -t 12h -n bert -- python train.py",
        ),
        (
            "Share a GPU: ask for 6 GiB of its memory.",
            "gpuq submit --gpu-mem 6G -- python small.py",
        ),
        (
            "Ten tasks, two at a time; each reads GPUQ_ARRAY_INDEX. The array gets an id of its "
            "own, which stands for all its tasks.",
            "gpuq submit --array 0-9%2 -- python sweep.py\n"
            "gpuq submit --after 32 -- python summarize.py",
        ),
        (
            "Submit a script that carries its own options in '#GPUQ' lines at its top, "
            "such as '#GPUQ --gpus 2 --time 4h'.",
            "gpuq submit train.sh",
        ),
        (
            "Run only on a server labelled a100 (daemon.labels, or labels of a "
            "[[cluster.servers]] table), but not on gpu3; the job waits, saying for which "
            "server, while none of its own is up.",
            "gpuq submit --label a100 --exclude-node gpu3 -- python train.py",
        ),
    ),
    "daemon": (("Is the daemon running, and what is it doing?", "gpuq daemon status"),),
    "daemon start": (("Start the daemon ahead of the first command.", "gpuq daemon start"),),
    "daemon stop": (("Stop the daemon; running jobs keep running.", "gpuq daemon stop"),),
    "sim": (
        (
            "Simulate Pollux on the first bundled trace (16 nodes x 4 GPUs).",
            "gpuq sim --policy pollux --workload workload-1",
        ),
        (
            "Compare policies on a generated workload for a 16-GPU lab.",
            "gpuq sim --compare gpuq,pollux,tiresias --workload gen:1 --nodes 4",
        ),
        (
            "Each policy's average JCT, for a script.",
            "gpuq sim --compare pollux,optimus -w workload-2 --json | jq '.results[].avg_jct'",
        ),
    ),
    "replay": (
        (
            "Run the first 20 jobs of a generated workload on this daemon, 120x faster.",
            "gpuq replay gen:1 --first 20 --speedup 120",
        ),
        (
            "A small trace of your own, simulated and live, average JCT of each.",
            "gpuq sim -p fifo -w jobs.csv --nodes 1 --gpus-per-node 2 --json | "
            "jq '.results[].avg_jct'; gpuq replay jobs.csv --json | jq '.results[].avg_jct'",
        ),
    ),
    "daemon run": (
        ("Run the daemon in the foreground, as systemd does.", "gpuq daemon run --log-level INFO"),
    ),
    "daemon restart": (("Restart the daemon after an upgrade.", "gpuq daemon restart"),),
    "daemon reload": (
        (
            "Apply an edited config file; it names the keys that need a restart.",
            "gpuq daemon reload",
        ),
        ("The same with a signal.", "kill -HUP $(gpuq daemon status --json | jq .pid)"),
    ),
    "daemon status": (
        ("The daemon's pid, paths and job counts.", "gpuq daemon status"),
        ("Only the pid, for a script.", "gpuq daemon status --json | jq .pid"),
        (
            "The event loop's worst lag over the last minute, in seconds.",
            "gpuq daemon status --json | jq .loop_lag.max",
        ),
    ),
}
"""Examples per command (key: the words after `gpuq`): a description and shell lines."""

SHELL_COMPLETION = (
    (
        "Install completion for the current shell (bash, zsh, fish or PowerShell):",
        "gpuq --install-completion",
    ),
    ("Or enable it in the current bash session only:", 'eval "$(_GPUQ_COMPLETE=source_bash gpuq)"'),
)
"""The SHELL COMPLETION section of gpuq(1)."""

RELATED: dict[str, tuple[str, ...]] = {
    "submit": ("ls", "show", "logs", "wait", "cancel"),
    "ls": ("show", "gpus"),
    "show": ("ls", "logs"),
    "logs": ("show",),
    "metrics": ("show", "top"),
    "wait": ("submit", "show"),
    "gpus": ("ls",),
    "top": ("ls", "gpus", "show"),
    "cancel": ("retry",),
    "retry": ("cancel",),
    "hold": ("release",),
    "release": ("hold",),
    "suspend": ("resume",),
    "resume": ("suspend",),
    "migrate": ("suspend", "show", "cluster"),
    "audit": ("lab",),
    "share": ("lab", "ls"),
    "lab": ("audit", "doctor"),
}
"""Further pages for SEE ALSO, beyond gpuq(1) and the enclosing group."""


@dataclass(frozen=True, slots=True)
class CommandDoc:
    """One command of the tree with its context (for help records)."""

    words: tuple[str, ...]
    command: Command
    ctx: Context

    @property
    def key(self) -> str:
        """The words after `gpuq`, as used in EXAMPLES (`daemon start`)."""
        return " ".join(self.words)

    @property
    def page(self) -> str:
        """The page name: `gpuq`, `gpuq-ls`, `gpuq-daemon-start`."""
        return "-".join(("gpuq", *self.words))

    @property
    def invocation(self) -> str:
        """How it is typed: `gpuq daemon start`."""
        return " ".join(("gpuq", *self.words))


def command_tree() -> list[CommandDoc]:
    """Every command of `gpuq`, depth first in declaration order, `gpuq` itself first."""
    from gpuq.cli.app import app

    root = typer.main.get_command(app)
    docs: list[CommandDoc] = []

    def walk(command: Command, ctx: Context, words: tuple[str, ...]) -> None:
        docs.append(CommandDoc(words, command, ctx))
        if isinstance(command, TyperGroup):
            for name in command.list_commands(ctx):
                sub = command.get_command(ctx, name)
                if sub is not None and not sub.hidden:
                    sub_ctx = Context(sub, info_name=name, parent=ctx, **sub.context_settings)
                    walk(sub, sub_ctx, (*words, name))

    walk(root, Context(root, info_name="gpuq", **root.context_settings), ())
    return docs


def escape(text: str) -> str:
    r"""Roff-escape text: backslashes, hyphens and a leading `.` or `'`.

    Hyphens become `\-` so options copy as ASCII; a leading `.` or `'` would
    otherwise start a roff request.
    """
    text = text.replace("\\", "\\e").replace("-", "\\-")
    return "\n".join("\\&" + line if line[:1] in (".", "'") else line for line in text.split("\n"))


def short_help(command: Command) -> str:
    """The one-line summary used in NAME and command lists."""
    return command.get_short_help_str(limit=200).rstrip(".")


def paragraphs(text: str) -> list[str]:
    """Help text split into paragraphs, each joined onto one line."""
    return [" ".join(p.split()) for p in re.split(r"\n\s*\n", text.strip()) if p.strip()]


def _argument_metavar(param: TyperArgument) -> str:
    name = param.metavar or param.name.upper()
    return f"{name}..." if param.nargs == -1 else name


def _option_metavar(param: TyperOption) -> str:
    return param.metavar or param.name.upper()


def synopsis(doc: CommandDoc) -> str:
    """The SYNOPSIS line: options, then arguments (optional ones bracketed)."""
    parts = [f".B {escape(doc.invocation)}", "[\\fIOPTIONS\\fR]"]
    if isinstance(doc.command, TyperGroup):
        parts.append("\\fICOMMAND\\fR [\\fIARGS\\fR]...")
    for param in doc.command.get_params(doc.ctx):
        if isinstance(param, TyperArgument):
            shown = f"\\fI{escape(_argument_metavar(param))}\\fR"
            parts.append(shown if param.required else f"[{shown}]")
    return "\n".join(parts)


def options(doc: CommandDoc) -> list[str]:
    """`.TP` entries for the arguments, then the options (as `--help` shows them)."""
    lines: list[str] = []
    params = doc.command.get_params(doc.ctx)
    for param in params:
        if isinstance(param, TyperArgument) and not param.hidden:
            lines += [
                ".TP",
                f"\\fI{escape(_argument_metavar(param))}\\fR",
                escape(param.help or ""),
            ]
    for param in params:
        record = param.get_help_record(doc.ctx) if isinstance(param, TyperOption) else None
        if not isinstance(param, TyperOption) or record is None:
            continue
        names = sorted(param.opts, key=lambda opt: len(opt) - len(opt.lstrip("-")))
        names += param.secondary_opts
        term = ", ".join(f"\\fB{escape(name)}\\fR" for name in names)
        if not (param.is_flag or param.count):
            term += f" \\fI{escape(_option_metavar(param))}\\fR"
        lines += [".TP", term, escape(" ".join(record[1].split()))]
    return lines


def gpuq_environment() -> dict[str, str]:
    """The variables the `gpuq` command reads, from `gpuq.env`'s docstring."""
    found = re.findall(
        r"^- ``(GPUQ_\w+)``: (.+?)(?=\n- |\n\n|\Z)", job_env.__doc__ or "", re.M | re.S
    )
    if not found:
        raise RuntimeError("no '- ``GPUQ_...``: meaning' lines in gpuq.env's docstring")
    meanings = {name: " ".join(text.split()).replace("``", "") for name, text in found}
    return {name: text[:1].upper() + text[1:] for name, text in meanings.items()}


def _tp_list(entries: dict[str, str]) -> list[str]:
    lines: list[str] = []
    for name, meaning in entries.items():
        lines += [".TP", f".B {escape(name)}", escape(meaning.replace("`", ""))]
    return lines


def environment() -> list[str]:
    """The ENVIRONMENT section body: gpuq's own variables, then the job contract."""
    return [
        *_tp_list(gpuq_environment()),
        '.SS "Set in every job\'s environment"',
        *_tp_list(job_env.CONTRACT),
        '.SS "Set in each part of a multi-node job (\\-\\-nodes N)"',
        *_tp_list(job_env.RENDEZVOUS),
        '.SS "Set for a job\'s \\-\\-notify command"',
        *_tp_list(NOTIFY_ENVIRONMENT),
    ]


def exit_status(doc: CommandDoc) -> list[str]:
    """The EXIT STATUS section body, one entry per `ExitCode`."""
    missing = [code.name for code in ExitCode if code not in EXIT_STATUS]
    if missing:
        raise RuntimeError(f"EXIT_STATUS has no meaning for {', '.join(missing)}")
    lines: list[str] = []
    for code in ExitCode:
        lines += [".TP", f".B {int(code)}", escape(EXIT_STATUS[code])]
    note = EXIT_STATUS_NOTES.get(doc.key)
    if note:
        lines += [".PP", escape(note)]
    return lines


def examples(doc: CommandDoc) -> list[str]:
    """The EXAMPLES section body; a command without examples is an error."""
    entries = EXAMPLES.get(doc.key)
    if not entries:
        raise RuntimeError(f"no EXAMPLES for {doc.invocation!r} in gpuq/cli/manpages.py")
    return shell_blocks(entries)


def shell_blocks(entries: Sequence[tuple[str, str]]) -> list[str]:
    """Each description as a paragraph, followed by its shell lines, indented."""
    lines: list[str] = []
    for description, shell in entries:
        lines += [".PP", escape(description), ".PP", ".RS 4", ".nf", escape(shell), ".fi", ".RE"]
    return lines


def command_list(docs: Sequence[CommandDoc], parent: CommandDoc) -> list[str]:
    """`.TP` entries naming the direct children of a group with their summaries."""
    lines: list[str] = []
    for doc in docs:
        if doc.words[:-1] == parent.words and doc.words:
            lines += [".TP", f"\\fB{escape(doc.page)}\\fR(1)", escape(short_help(doc.command))]
    return lines


def see_also(doc: CommandDoc, docs: Sequence[CommandDoc]) -> str:
    """The SEE ALSO references: gpuq(1), the enclosing group, the children."""
    pages = [] if not doc.words else ["gpuq"]
    if len(doc.words) > 1:
        pages.append("-".join(("gpuq", *doc.words[:-1])))
    pages += [d.page for d in docs if d.words and d.words[:-1] == doc.words]
    pages += ["gpuq-" + related.replace(" ", "-") for related in RELATED.get(doc.key, ())]
    return ",\n".join(f".BR {escape(page)} (1)" for page in pages)


def render(doc: CommandDoc, docs: Sequence[CommandDoc]) -> str:
    """The complete roff source of one page."""
    command = doc.command
    lines = [
        '.\\" Generated by "python -m gpuq.cli.manpages" from the command tree; do not edit.',
        f'.TH {escape(doc.page.upper())} 1 "" "gpuq {escape(__version__)}" "gpuq manual"',
        ".SH NAME",
        f"{escape(doc.page)} \\- {escape(short_help(command))}",
        ".SH SYNOPSIS",
        synopsis(doc),
        ".SH DESCRIPTION",
    ]
    description = paragraphs(command.help or "")
    if not doc.words:
        description += ROOT_DESCRIPTION
    for number, paragraph in enumerate(description):
        lines += ([] if number == 0 else [".PP"]) + [escape(paragraph)]
    if isinstance(command, TyperGroup):
        lines += [".SH COMMANDS", *command_list(docs, doc)]
    lines += [".SH OPTIONS", *options(doc)]
    lines += [".SH ENVIRONMENT", *environment()]
    lines += [".SH EXIT STATUS", *exit_status(doc)]
    lines += [".SH EXAMPLES", *examples(doc)]
    if not doc.words:
        lines += [".SH SHELL COMPLETION", *shell_blocks(SHELL_COMPLETION)]
    lines += [".SH SEE ALSO", see_also(doc, docs)]
    return "\n".join(lines) + "\n"


def generate() -> dict[str, str]:
    """Every page: file name -> roff source."""
    docs = command_tree()
    return {f"{doc.page}.1": render(doc, docs) for doc in docs}


def drifted(pages: dict[str, str], out_dir: Path) -> list[str]:
    """Pages in `out_dir` that are missing, differ, or are no longer generated."""
    problems = []
    for name, text in pages.items():
        path = out_dir / name
        if not path.exists():
            problems.append(f"{path} (missing)")
        elif path.read_text() != text:
            problems.append(f"{path} (differs)")
    for path in sorted(out_dir.glob("gpuq*.1")):
        if path.name not in pages:
            problems.append(f"{path} (no such command any more)")
    return problems


def main(argv: Sequence[str] | None = None) -> int:
    """Write the pages, or with --check report drift; returns the exit status."""
    parser = argparse.ArgumentParser(
        prog="python -m gpuq.cli.manpages", description="Generate gpuq's man pages."
    )
    parser.add_argument("--out", default="man", type=Path, help="directory (default: man)")
    parser.add_argument(
        "--check", action="store_true", help="write nothing; exit 1 if the pages are stale"
    )
    args = parser.parse_args(argv)
    out_dir: Path = args.out
    pages = generate()
    if args.check:
        problems = drifted(pages, out_dir)
        for problem in problems:
            print(f"stale man page: {problem}", file=sys.stderr)
        if problems:
            print("hint: regenerate with: python -m gpuq.cli.manpages", file=sys.stderr)
        return 1 if problems else 0
    out_dir.mkdir(parents=True, exist_ok=True)
    for path in sorted(out_dir.glob("gpuq*.1")):
        if path.name not in pages:
            path.unlink()
    for name, text in pages.items():
        (out_dir / name).write_text(text)
    print(f"wrote {len(pages)} man pages to {out_dir}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
