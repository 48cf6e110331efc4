#!/usr/bin/env python3
"""Golden renderings of the chat templates in tests/fixtures/chat_templates/, made with
Python jinja2 in the environment HF transformers renders chat templates with
(transformers.utils.chat_template_utils._compile_jinja_template): an immutable sandbox,
trim_blocks and lstrip_blocks on, the loopcontrols extension, raise_exception(),
strftime_now() and a tojson filter that is json.dumps(ensure_ascii=False).

    /usr/bin/python3 tools/chat_goldens.py      # Debian's python3-jinja2

writes tests/fixtures/chat_templates/goldens.json: for each template and each case of
cases.json either {"text": rendering}, {"raise": message} (the template's own
raise_exception) or {"fails": exception type} (any other error: the C++ renderer must fail
too). tests/tokenizer/chat_template_test.cpp compares byte for byte. To add a template:
put its text in the folder, list it in templates.json, rerun, commit."""
import datetime
import json
import os
import sys

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures", "chat_templates")
NOW = 1721995200  # 2024-07-26 12:00:00 UTC: the date strftime_now() gives (the test uses the same)


class Raised(Exception):
    pass


def raise_exception(message):
    raise Raised(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def strftime_now(fmt):
    return datetime.datetime.fromtimestamp(NOW).strftime(fmt)


def environment():
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def main():
    with open(os.path.join(HERE, "templates.json")) as f:
        templates = {k: v for k, v in json.load(f).items() if not k.startswith("_")}
    with open(os.path.join(HERE, "cases.json")) as f:
        cases = {k: v for k, v in json.load(f).items() if not k.startswith("_")}
    env = environment()
    out = {"_generator": "tools/chat_goldens.py with jinja2 " + jinja2.__version__}
    for name, t in templates.items():
        with open(os.path.join(HERE, t["file"]), encoding="utf-8") as f:
            tpl = env.from_string(f.read())
        specials = {k: t[k] for k in ("bos_token", "eos_token") if k in t}
        res = {}
        for cname, c in cases.items():
            try:
                text = tpl.render(messages=c["messages"], tools=c.get("tools"),
                                  add_generation_prompt=c["add_generation_prompt"],
                                  **specials, **c.get("kwargs", {}))
                res[cname] = {"text": text}
            except Raised as e:
                res[cname] = {"raise": str(e)}
            except Exception as e:  # noqa: BLE001 - any failure is a golden outcome
                res[cname] = {"fails": type(e).__name__}
        out[name] = res
    with open(os.path.join(HERE, "goldens.json"), "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print("wrote", os.path.join(HERE, "goldens.json"), file=sys.stderr)


if __name__ == "__main__":
    main()
