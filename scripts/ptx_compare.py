#!/usr/bin/env python3
"""Whether two PTX files are the same code: the check behind scripts/ptx-same.sh.

Compares after dropping what does not change the machine code's meaning: `.loc` / `.file` lines, comments and the
path hash in anonymous namespaces' names. Prints
one line and exits with:
  0  identical
  1  identical once virtual register and label numbers are ignored (%r12 vs %r13: the same instructions, renamed; ptxas
     almost always produces the same machine code, but that is not a proof: measure or test on the device)
  2  different (the first differing lines are printed, then entry by entry: which kernels are identical, identical
     up to register and label numbers, different, or only in one file — so an added kernel, or one whose mangled
     name changed, is told from a change to the others)

  python3 scripts/ptx_compare.py before.ptx after.ptx
"""
import difflib
import re
import sys

_VREG = re.compile(r"%(r|rd|rs|f|fd|p|h|hh|b)\d+\b")
# a basic block's label carries its entry's index in the file ($L__BB3_7): adding a kernel renumbers the later ones
_LABEL = re.compile(r"\$L__BB\d+_")
_ENTRY = re.compile(r"^(?:\.visible |\.weak )?\.(?:entry|func) (?:\([^)]*\) )?([\w$]+)")
# an anonymous namespace's mangled name carries a hash of the file's path (a worktree elsewhere changes it, not the code)
_ANON = re.compile(r"_GLOBAL__N__[0-9a-f]{8}_")


def normalise(text, rename=False):
    lines = []
    for line in text.split("\n"):
        s = line.strip()
        if not s or s.startswith(".loc") or s.startswith(".file") or s.startswith("//"):
            continue
        s = _ANON.sub("_GLOBAL__N__", s.split("//", 1)[0].rstrip())
        if rename:
            s = _VREG.sub(lambda m: "%" + m.group(1), s)
            s = _LABEL.sub("$L__BB_", s)
            if re.match(r"\.reg \.\w+ \s*%\w+<\d+>;", s):  # the register counts move with renaming
                continue
        lines.append(s)
    return lines


def entries(lines):
    """The normalised lines split by .entry / .func: {name: lines} (what precedes the first one is left out)."""
    out, name = {}, None
    for line in lines:
        m = _ENTRY.match(line)
        if m:
            name = m.group(1)
            out[name] = []
        if name is not None:
            out[name].append(line)
    return out


def by_entry(a, b):
    ea, eb = entries(normalise(a)), entries(normalise(b))
    ra, rb = entries(normalise(a, True)), entries(normalise(b, True))
    groups = {"identical": [], "identical up to register / label numbers": [], "different": [], "only before": [],
              "only after": []}
    for name in ea:
        if name not in eb:
            groups["only before"].append(name)
        elif ea[name] == eb[name]:
            groups["identical"].append(name)
        elif ra[name] == rb[name]:
            groups["identical up to register / label numbers"].append(name)
        else:
            groups["different"].append(name)
    groups["only after"] = [n for n in eb if n not in ea]
    for what, names in groups.items():
        if names:
            print(f"  {len(names)} {what}" + (":" if what != "identical" else ""))
            if what != "identical":
                for n in names[:8]:
                    print("    " + n)
                if len(names) > 8:
                    print(f"    ... {len(names) - 8} more")


def main():
    if len(sys.argv) != 3:
        print(__doc__.strip().split("\n")[-1].strip(), file=sys.stderr)
        return 3
    with open(sys.argv[1]) as f:
        a = f.read()
    with open(sys.argv[2]) as f:
        b = f.read()
    if normalise(a) == normalise(b):
        print("identical PTX")
        return 0
    na, nb = normalise(a, True), normalise(b, True)
    if na == nb:
        print("identical PTX up to virtual register numbers")
        return 1
    diff = [d for d in difflib.unified_diff(na, nb, lineterm="", n=0) if not d.startswith(("---", "+++", "@@"))]
    print(f"different PTX: {len(diff)} lines differ (registers renamed), first ones:")
    for d in diff[:12]:
        print("  " + d)
    print("by entry:")
    by_entry(a, b)
    return 2


if __name__ == "__main__":
    sys.exit(main())
