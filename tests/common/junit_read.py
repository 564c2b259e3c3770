"""Reads JUnit XML files with junitparser (a third-party reader from PyPI, as CI tools
use) and prints what it sees as JSON: per file its suites' counts and every case's
classname, name and result ("passed", "failure", "error" or "skipped").

Usage: python3 junit_read.py FILE...
"""
import json
import sys

from junitparser import Error, Failure, JUnitXml, Skipped, TestSuite


def suites(xml):
    if isinstance(xml, TestSuite):
        yield xml
    else:
        yield from xml


def result(case):
    kinds = {type(r) for r in case.result}
    for kind, name in ((Error, "error"), (Failure, "failure"), (Skipped, "skipped")):
        if kind in kinds:
            return name
    return "passed"


out = {}
for path in sys.argv[1:]:
    xml = JUnitXml.fromfile(path)
    doc = {"suites": [], "cases": []}
    for s in suites(xml):
        doc["suites"].append({"name": s.name, "tests": s.tests, "failures": s.failures,
                              "errors": s.errors, "skipped": s.skipped})
        for case in s:
            doc["cases"].append([case.classname, case.name, result(case)])
    out[path] = doc
json.dump(out, sys.stdout)
