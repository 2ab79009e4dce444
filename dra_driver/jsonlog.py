"""One JSON object per log line: what log collectors (Loki, Fluent Bit, Cloud Logging) parse without a rule."""

from __future__ import annotations

import json
import logging
import time


class JsonFormatter(logging.Formatter):
    """`{"time", "level", "logger", "msg"}`, plus `"error"` with the traceback when one is logged. json.dumps
    escapes quotes, backslashes and newlines, so a message or traceback never breaks the line."""

    def format(self, record: logging.LogRecord) -> str:
        line = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        if record.exc_info:
            line["error"] = self.formatException(record.exc_info)
        elif record.exc_text:
            line["error"] = record.exc_text
        if record.stack_info:
            line["stack"] = self.formatStack(record.stack_info)
        return json.dumps(line, ensure_ascii=False)


def configure(level: int) -> None:
    """The process's root logger writes JSON lines to stderr at `level`."""
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter())
    logging.basicConfig(level=level, handlers=[handler])
