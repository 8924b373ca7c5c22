#!/usr/bin/env python3
"""The loops of one kernel's SASS and what is in them, from `cuobjdump -sass` text.

Usage: sass_loops.py SASS_TEXT FUNCTION_SUBSTRING [--copies] [--body START_HEX]

Prints the function's instruction count and opcode mix, then every loop (a backward
branch and the instructions it jumps over) that contains a tensor-core MMA (with
--copies also those of the global->shared copies): its size and the counts that usually matter (spill loads and
stores, shared loads, byte permutes, logic ops, integer multiply-adds, packed FP16
multiplies, shifts, branches). --body prints the loop starting at START_HEX.
A static count: a loop's masked branches are included, so the common path is shorter.
"""
import collections
import re
import sys

INSTR = re.compile(r"\s+/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")
OP = re.compile(r"(@!?U?P\w+\s+)?([A-Z0-9_]+)")
BRANCH = re.compile(r"BRA\S*\s+(?:!?U?P\d,\s*)?0x([0-9a-f]+)")
KEYS = ["LDL", "STL", "LDS", "PRMT", "LOP3", "IMAD", "HMUL2", "SHF", "BRA"]


def function_instructions(text, name):
    out, on = [], False
    for line in text.splitlines():
        if "Function :" in line:
            on = name in line
            continue
        m = INSTR.match(line) if on else None
        if m:
            out.append((int(m.group(1), 16), m.group(2)))
    return out


def opcode(instr):
    m = OP.match(instr)
    return m.group(2) if m else "?"


def main(argv):
    if len(argv) < 3:
        print(__doc__)
        return 2
    ins = function_instructions(open(argv[1]).read(), argv[2])
    if not ins:
        print("no function matching %r" % argv[2])
        return 1
    mix = collections.Counter(opcode(t) for _, t in ins)
    print("%d instructions; most frequent: %s" % (len(ins), ", ".join("%s %d" % kv for kv in mix.most_common(12))))
    copies = "--copies" in argv
    body_at = int(argv[argv.index("--body") + 1], 16) if "--body" in argv else None
    for addr, text in ins:
        m = BRANCH.search(text)
        if not m or int(m.group(1), 16) >= addr:
            continue
        start = int(m.group(1), 16)
        body = [t for a, t in ins if start <= a <= addr]
        ops = collections.Counter(opcode(t) for t in body)
        # Loops that hold the tile's MMAs or copies; not the spans of slow-path
        # retries at the function's end, which jump back over most of it.
        copy = ops["LDGSTS"] or ops["UTMALDG"] or ops["UBLKCP"]
        if not (ops["HMMA"] or (copies and copy)) or len(body) > len(ins) // 4:
            continue
        print("loop 0x%x-0x%x: %d instructions, HMMA %d, %s" % (start, addr, len(body), ops["HMMA"],
              ", ".join("%s %d" % (k, ops[k]) for k in KEYS)))
        if body_at == start:
            print("\n".join("    " + t for t in body))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
