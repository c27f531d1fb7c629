#!/usr/bin/env python3
"""A stand-in for compute-sanitizer: saves a clean XML report where --save
says, runs the program after its own options, and prints a clean summary."""
import subprocess, sys

args = sys.argv[1:]
with_value = {"--tool", "--save", "--print-limit", "--leak-check"}
i = 0
while i < len(args) and args[i].startswith("--"):
    i += 2 if args[i] in with_value else 1
with open(args[args.index("--save") + 1], "w") as f:
    f.write('<?xml version="1.0" encoding="utf-8"?>\n<ComputeSanitizerOutput/>\n')
rc = subprocess.call(args[i:])
print("========= ERROR SUMMARY: 0 errors")
sys.exit(rc)
