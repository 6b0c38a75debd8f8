#!/usr/bin/python3
"""Runs every command a user copies from README.md and examples/README.md, in a short form.

A documented command that no longer works is a broken product even when every unit test
passes, so CI runs them all: each ```sh block of the two pages is read, continuation lines are
joined, and every command is run with fewer steps (see short_form) in a scratch folder that
sees the repository's examples/, data/ and build/. A command this script cannot run here (it
needs several machines, or it is the test suite itself) must be listed in NOT_RUN with where it
is covered instead; any other command it does not know fails the check, so that a new command
block cannot escape it.

Usage: /usr/bin/python3 scripts/doc_commands.py [--list] [--only TEXT] [--build DIR]
Exit status: 0 when every command ran and succeeded, 1 otherwise.
"""
import argparse
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time

PAGES = ["README.md", "examples/README.md"]

# Commands that are documented but not run here, each with where it is covered instead. Keyed
# by a prefix of the command as written (continuations joined, spaces collapsed).
NOT_RUN = {
    "make demo-sparse": "CI runs scripts/demo_sparse.sh --short, the same command with one epoch",
    "make demo": "CI runs scripts/demo.sh --short, the same command with fewer rounds",
    "make test": "CI runs it",
    "bash scripts/setup.sh": "make test runs it first",
    "cmake -S . -B build": "make test runs the same configure and build",
    "ctest --test-dir build": "make test runs it",
    "chorus topo check lab.toml": "lab.toml is the reader's own file; tests/topology check files",
    "chorus node --topology lab.toml": "needs one machine per node; tests/node and tests/cli run "
                                       "the same nodes on loopback",
    "bench/kge_reference.sh": "a benchmark: the PyTorch side takes minutes per epoch; "
                              "tests/ml check the same training (KgeTrainingTest)",
}

# Steps in the short form of a training command (rounds for launch, node and compare).
SHORT_ROUNDS = 20
SHORT_TRAIN_SAMPLES = 2000
SHORT_RATINGS = 200000
SHORT_KGE_DIM = 64
SHORT_KGE_NEGATIVES = 256
KGE_MODELS = ("complex", "distmult", "transe")
SPARSE_MODELS = KGE_MODELS + ("mf",)


def blocks(path):
    """The ```sh blocks of a Markdown page: (line number, text) per block."""
    out, current, start = [], None, 0
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            stripped = line.strip()
            if current is None and stripped.startswith("```sh"):
                current, start = [], number + 1
            elif current is not None and stripped.startswith("```"):
                out.append((start, current))
                current = None
            elif current is not None:
                current.append(line.rstrip("\n"))
    return out


def commands(path):
    """Every command of a page's sh blocks: (page:line, command) with continuations joined and
    comments dropped."""
    out = []
    for start, lines in blocks(path):
        pending, pending_line = "", 0
        for offset, line in enumerate(lines):
            text = re.sub(r"(^|\s)#.*$", "", line).rstrip()
            if not pending:
                pending_line = start + offset
                if not text.strip():
                    continue
            if text.endswith("\\"):
                pending += text[:-1].strip() + " "
                continue
            pending += text.strip()
            out.append((f"{path}:{pending_line}", " ".join(pending.split())))
            pending = ""
    return out


def not_run_reason(command):
    plain = re.sub(r"^(build/cli/)?chorus ", "chorus ", command)
    for prefix, reason in NOT_RUN.items():
        if plain.startswith(prefix):
            return reason
    return None


def drop_option(argv, flag):
    """argv without `flag VALUE`."""
    out, skip = [], False
    for i, a in enumerate(argv):
        if skip:
            skip = False
            continue
        if a == flag and i + 1 < len(argv):
            skip = True
            continue
        out.append(a)
    return out


def narrow_kge(argv):
    """A KGE command with its embedding width and negatives capped (SHORT_KGE_DIM,
    SHORT_KGE_NEGATIVES); other options stay as written."""
    for option, cap in (("--dim", SHORT_KGE_DIM), ("--negatives", SHORT_KGE_NEGATIVES)):
        if option in argv and int(argv[argv.index(option) + 1]) > cap:
            argv = drop_option(argv, option) + [option, str(cap)]
    return argv


def short_form(argv, shared):
    """The command with fewer steps: chorus train runs one epoch (on the first samples, or on
    fewer generated ratings); launch,
    node and compare run SHORT_ROUNDS rounds and evaluate every 10; crash steps move into those
    rounds; ../shared/ points at the datasets beside this clone."""
    argv = [a.replace("../shared/", shared + "/") for a in argv]
    if not argv or os.path.basename(argv[0]) != "chorus" or len(argv) < 2:
        return argv
    command = argv[1]
    if command == "train":
        argv = drop_option(argv, "--epochs") + ["--epochs", "1"]
        model = argv[argv.index("--model") + 1] if "--model" in argv else ""
        if model == "mf":
            if "--data-file" not in argv:  # generated ratings: fewer cells
                argv = drop_option(argv, "--mf-cells") + ["--mf-cells", str(SHORT_RATINGS)]
        elif model in KGE_MODELS:
            # One epoch of WN18RR is short, but the filtered evaluation of valid and test at the
            # end scores every entity for each triple: at --dim 500 that alone takes minutes on
            # two cores. A narrower model runs the same flags through the same code.
            argv = narrow_kge(argv)
        else:
            argv += ["--limit", str(SHORT_TRAIN_SAMPLES)]
    elif command in ("launch", "node", "compare") and ("--model" in argv and
                                             argv[argv.index("--model") + 1] in SPARSE_MODELS):
        # A sparse model counts epochs, not rounds: one epoch of WN18RR or generated ratings
        # (compare: for each of its variants).
        argv = narrow_kge(drop_option(argv, "--epochs") + ["--epochs", "1"])
    elif command in ("launch", "node", "compare"):
        argv = drop_option(drop_option(argv, "--eval-every"), "--rounds")
        argv += ["--rounds", str(SHORT_ROUNDS), "--eval-every", "10"]
        argv = [re.sub(r"crash:(\d+)@\d+", r"crash:\1@10", a) for a in argv]
    return argv


def run_one(where, command, workdir, shared, chorus, log):
    reason = not_run_reason(command)
    if reason:
        print(f"doc-commands: {where}: not run here ({reason}): {command}")
        return True
    # A shell line (a pipe, a redirection) runs as written; a chorus command runs short.
    if re.search(r"[|&;<>]", command):
        argv, shell = command, True
    else:
        argv = shlex.split(command)
        if argv[0] in ("chorus", "build/cli/chorus"):
            argv[0] = chorus
        else:
            print(f"doc-commands: {where}: FAILED: no short form known for: {command}\n"
                  f"  run it in scripts/doc_commands.py, or list it in NOT_RUN with where it is "
                  f"covered")
            return False
        argv, shell = short_form(argv, shared), False
    shown = argv if shell else shlex.join(argv)
    print(f"doc-commands: {where}: {shown}", flush=True)
    start = time.monotonic()
    with open(log, "a", encoding="utf-8") as out:
        out.write(f"\n===== {where}: {shown}\n")
        out.flush()
        result = subprocess.run(argv, shell=shell, cwd=workdir, stdout=out, stderr=out,
                                stdin=subprocess.DEVNULL, timeout=900)
    seconds = time.monotonic() - start
    if result.returncode != 0:
        print(f"doc-commands: {where}: FAILED with status {result.returncode} after "
              f"{seconds:.0f} s; its output is in {log}")
        with open(log, encoding="utf-8") as f:
            tail = f.read().splitlines()[-15:]
        print("\n".join("  | " + line for line in tail))
        return False
    print(f"doc-commands: {where}: ok in {seconds:.0f} s")
    return True


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--list", action="store_true", help="list the commands, run nothing")
    parser.add_argument("--only", default="", help="run only commands containing this text")
    parser.add_argument("--build", default="build", help="the build folder (default: build)")
    args = parser.parse_args()
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    found = [c for page in PAGES for c in commands(os.path.join(repo, page))]
    found = [(os.path.relpath(w, repo), c) for w, c in found if args.only in c]
    if args.list:
        for where, command in found:
            print(f"{where}: {command}")
        return 0
    chorus = os.path.join(repo, args.build, "cli", "chorus")
    if not os.access(chorus, os.X_OK):
        print(f"doc-commands: {chorus} is missing: build first (make build)", file=sys.stderr)
        return 1
    shared = os.path.join(os.path.dirname(repo), "shared")
    workdir = tempfile.mkdtemp(prefix="chorus-doc-commands-")
    # The commands' relative paths (examples/, data/, build/, scripts/) resolve as in the repo.
    for entry in os.listdir(repo):
        if not entry.startswith("."):
            os.symlink(os.path.join(repo, entry), os.path.join(workdir, entry))
    os.makedirs(os.path.join(repo, "runs"), exist_ok=True)
    log = os.path.join(repo, "runs", "doc-commands.log")
    open(log, "w").close()
    env_path = os.path.dirname(chorus) + os.pathsep + os.environ.get("PATH", "")
    os.environ["PATH"] = env_path
    failed = [w for w, c in found if not run_one(w, c, workdir, shared, chorus, log)]
    shutil.rmtree(workdir, ignore_errors=True)
    print(f"doc-commands: {len(found) - len(failed)} passed, {len(failed)} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
