#!/usr/bin/env python3
"""Runs the ```console blocks of a Markdown file as written and compares their output.

usage: run_console.py DOC.md --bin DIR --root REPO [--cpp FILE]

Each "$ command" line runs in one scratch directory shared by all blocks (so later
blocks see earlier blocks' files), with DIR first on PATH and REPO's examples/ linked
in. The lines after a command, up to the next one, are its expected output: each must
appear, in that order, as a whole line of what the command printed (stdout and stderr,
trailing spaces ignored); "..." stands for lines left out; "[exit N]" is the expected
exit status (0 when absent). With --cpp, every ```cpp block must be FILE's text, which
CI compiles and runs. Exit 0 when everything matches, 1 with what did not.
"""
import argparse
import os
import re
import subprocess
import sys
import tempfile


def blocks(text, lang):
    return re.findall(r"^```" + lang + r"\n(.*?)^```", text, flags=re.S | re.M)


def commands(block):
    """[(command, expected lines, exit status)] of one console block."""
    out = []
    for line in block.splitlines():
        if line.startswith("$ "):
            out.append([line[2:], [], 0])
        elif not out:
            raise SystemExit(f"output before any command in block:\n{block}")
        elif m := re.fullmatch(r"\[exit (\d+)\]", line.strip()):
            out[-1][2] = int(m.group(1))
        elif line.strip() != "...":
            out[-1][1].append(line.rstrip())
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("doc")
    ap.add_argument("--bin", required=True)
    ap.add_argument("--root", required=True)
    ap.add_argument("--cpp")
    a = ap.parse_args()
    with open(a.doc) as f:
        text = f.read()
    failures, ran = [], 0
    if a.cpp:
        with open(a.cpp) as f:
            source = f.read()
        for code in blocks(text, "cpp"):
            if code != source:
                failures.append(f"a cpp block of {a.doc} is not {a.cpp} as written")
    env = dict(os.environ, PATH=os.path.abspath(a.bin) + os.pathsep + os.environ.get("PATH", ""))
    with tempfile.TemporaryDirectory() as scratch:
        os.symlink(os.path.join(os.path.abspath(a.root), "examples"), os.path.join(scratch, "examples"))
        for block in blocks(text, "console"):
            for command, expected, status in commands(block):
                ran += 1
                p = subprocess.run(command, shell=True, cwd=scratch, env=env, stdout=subprocess.PIPE,
                                   stderr=subprocess.STDOUT, text=True, timeout=600)
                got = [line.rstrip() for line in p.stdout.splitlines()]
                why = []
                if p.returncode != status:
                    why.append(f"exit {p.returncode}, the doc says {status}")
                at = 0
                for want in expected:
                    while at < len(got) and got[at] != want:
                        at += 1
                    if at == len(got):
                        why.append(f"no line (in order) {want!r}")
                        break
                    at += 1
                if why:
                    failures.append(f"$ {command}\n  " + "\n  ".join(why) + "\n  it printed:\n    " +
                                    "\n    ".join(got[:40]))
    for f in failures:
        print("FAIL: " + f)
    print(f"{a.doc}: {ran} commands, {len(failures)} failures")
    sys.exit(1 if failures or ran == 0 else 0)


if __name__ == "__main__":
    main()
