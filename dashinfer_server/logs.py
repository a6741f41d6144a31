"""Log output of a server process: `--log-format text` (one readable line per record, for a
terminal or the journal) or `json` (one JSON object per line, for log collectors).

A record's structured fields go in `extra={"fields": {...}}`: the text format ignores them (the
message already says it all), the JSON format adds them to the object, so a collector reads
numbers instead of parsing sentences.
"""
import json
import logging
import sys
import time

FORMATS = ("text", "json")
LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
TEXT_FORMAT = "%(asctime)s %(name)s[%(process)d] %(levelname)s %(message)s"


class JsonFormatter(logging.Formatter):
    """{"time", "level", "logger", "pid", "message", ...fields, "error"?} on one line."""

    def format(self, record: logging.LogRecord) -> str:
        out = {"time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
               + f".{int(record.msecs):03d}Z",
               "level": record.levelname, "logger": record.name, "pid": record.process,
               "message": record.getMessage()}
        out.update(getattr(record, "fields", None) or {})
        if record.exc_info:
            out["error"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


def configure(level: str = "INFO", fmt: str = "text", stream=None) -> None:
    """Send every logger's records at `level` and above to stderr (or `stream`) in `fmt`."""
    if fmt not in FORMATS:
        raise ValueError(f"log format {fmt!r}: use one of {', '.join(FORMATS)}")
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(TEXT_FORMAT))
    logging.basicConfig(level=level, handlers=[handler], force=True)
