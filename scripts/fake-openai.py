#!/usr/bin/env python3
"""A small OpenAI-compatible upstream for fork's gateway tests and the README demo.

Standard library only. Listens on loopback only and answers:

  POST /v1/chat/completions   a deterministic reply; usage.prompt_tokens = words in the
                              prompt (all message contents), usage.completion_tokens =
                              words in the reply. With "stream": true it sends SSE chunks,
                              one per word, then a usage chunk ONLY when
                              stream_options.include_usage is true, then `data: [DONE]`.
  POST /v1/embeddings         one fixed-length vector per input, usage {prompt_tokens, total_tokens}
  GET  /v1/models             the models it "serves" (any model name is accepted)
  GET  /fake/stats            {"requests": N} counted over the /v1 endpoints, and
                              "last_chat_limits": the max_tokens / max_completion_tokens
                              the last chat call carried, as sent (absent ones left out)

Options:
  --port N --port-file F      port to bind (0: any free one), written to F once listening
  --require-key KEY           answer 401 unless `Authorization: Bearer KEY` was sent
  --echo-headers              put the request headers it received in the reply content,
                              and echo Authorization / set a cookie in response headers
                              (so a test can see what reached the upstream and what the
                              gateway lets back)
  --no-usage                  never include usage (to test the gateway's estimate)
  --chunk-delay-ms N          sleep between streamed chunks
  --delay-ms N                sleep before answering a chat or embeddings call (the call
                              is counted, and "billed", whether or not the client waits)
  --refuse-field NAME         answer a chat call that carries NAME 400 unsupported_parameter
                              (as OpenAI's reasoning models answer max_tokens)
  --pad-bytes N --pad-depth D a non-streamed chat reply carries "fake_pad": about N bytes
                              of small objects, D arrays deep, before its usage
  --max-requests N / --max-seconds N   exit after that many requests / seconds

Example: python3 scripts/fake-openai.py --port 0 --port-file /tmp/fake.port
"""

import argparse
import json
import os
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

LOOPBACK = {"127.0.0.1", "localhost"}
MAX_BODY = 16 << 20
EMBEDDING_DIM = 8


def words(text):
    return len(str(text).split())


def message_text(messages):
    """All the text of the messages (string contents and text parts)."""
    out = []
    for m in messages if isinstance(messages, list) else []:
        c = m.get("content") if isinstance(m, dict) else None
        if isinstance(c, str):
            out.append(c)
        elif isinstance(c, list):
            for part in c:
                if isinstance(part, dict) and isinstance(part.get("text"), str):
                    out.append(part["text"])
    return " ".join(out)


class State:
    def __init__(self, args):
        self.args = args
        self.lock = threading.Lock()
        self.requests = 0
        self.last_chat_limits = None
        self.total = 0
        self.done = threading.Event()

    def count(self):
        with self.lock:
            self.requests += 1

    def finished(self):
        """Called once a request has been answered: counts towards --max-requests."""
        with self.lock:
            self.total += 1
            if self.total >= self.args.max_requests:
                self.done.set()


def make_handler(state):
    args = state.args

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.0"
        server_version = "fake-openai/1"

        def log_message(self, fmt, *a):  # quiet: tests read stdout/stderr only on failure
            if os.environ.get("FAKE_OPENAI_VERBOSE"):
                sys.stderr.write("fake-openai: " + (fmt % a) + "\n")

        def finish(self):
            try:
                super().finish()
            finally:
                state.finished()

        def send_json(self, status, obj, extra=None):
            body = json.dumps(obj).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.send_header("X-Request-Id", "req-fake-%d" % state.requests)
            for k, v in (extra or {}).items():
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(body)

        def echo_extra(self):
            if not args.echo_headers:
                return {}
            return {
                "X-Echo-Authorization": self.headers.get("Authorization", ""),
                "Set-Cookie": "fake_session=1",
            }

        def authorized(self):
            if args.require_key is None:
                return True
            if self.headers.get("Authorization") == "Bearer " + args.require_key:
                return True
            self.send_json(401, {"error": {"type": "invalid_request_error",
                                           "code": "invalid_api_key",
                                           "message": "missing or wrong API key"}})
            return False

        def read_json(self):
            try:
                n = int(self.headers.get("Content-Length") or 0)
            except ValueError:
                n = -1
            if n < 0 or n > MAX_BODY:
                self.send_json(413, {"error": {"message": "body too large"}})
                return None
            raw = self.rfile.read(n)
            try:
                obj = json.loads(raw)
            except ValueError:
                self.send_json(400, {"error": {"message": "body is not JSON"}})
                return None
            if not isinstance(obj, dict):
                self.send_json(400, {"error": {"message": "body is not a JSON object"}})
                return None
            return obj

        def do_GET(self):
            path = self.path.split("?")[0]
            if path == "/fake/stats":
                with state.lock:
                    stats = {"requests": state.requests}
                    if state.last_chat_limits is not None:
                        stats["last_chat_limits"] = state.last_chat_limits
                self.send_json(200, stats)
                return
            state.count()
            if not self.authorized():
                return
            if path == "/v1/models":
                self.send_json(200, {"object": "list", "data": [
                    {"id": "fake-model", "object": "model", "created": 0, "owned_by": "fake"}]})
            else:
                self.send_json(404, {"error": {"message": "no such endpoint " + path}})

        def do_POST(self):
            path = self.path.split("?")[0]
            state.count()
            if not self.authorized():
                return
            req = self.read_json()
            if req is None:
                return
            if args.delay_ms and path in ("/v1/chat/completions", "/v1/embeddings"):
                time.sleep(args.delay_ms / 1000.0)
            if path == "/v1/chat/completions":
                self.chat(req)
            elif path == "/v1/embeddings":
                self.embeddings(req)
            else:
                self.send_json(404, {"error": {"message": "no such endpoint " + path}})

        def reply_text(self, prompt):
            text = "fake reply to: " + " ".join(prompt.split()[:5])
            if args.echo_headers:
                hdrs = {k: v for k, v in self.headers.items()}
                text += " headers: " + json.dumps(hdrs, sort_keys=True)
            return text

        def chat(self, req):
            with state.lock:
                state.last_chat_limits = {k: req[k] for k in ("max_tokens", "max_completion_tokens")
                                          if k in req}
            if args.refuse_field and args.refuse_field in req:
                self.send_json(400, {"error": {
                    "message": "Unsupported parameter: '%s' is not supported with this model."
                               % args.refuse_field,
                    "type": "invalid_request_error", "param": args.refuse_field,
                    "code": "unsupported_parameter"}})
                return
            prompt = message_text(req.get("messages"))
            reply = self.reply_text(prompt)
            model = str(req.get("model", ""))
            usage = {"prompt_tokens": words(prompt), "completion_tokens": words(reply),
                     "total_tokens": words(prompt) + words(reply)}
            if req.get("stream") is True:
                opts = req.get("stream_options")
                include = isinstance(opts, dict) and opts.get("include_usage") is True
                self.stream_chat(model, reply, usage if include and not args.no_usage else None,
                                 include)
                return
            out = {"id": "chatcmpl-fake", "object": "chat.completion", "created": 0,
                   "model": model,
                   "choices": [{"index": 0, "finish_reason": "stop",
                                "message": {"role": "assistant", "content": reply}}]}
            if args.pad_bytes:
                pad = [{"i": i, "v": [i, 0.5, None, "pad"]} for i in range(args.pad_bytes // 40)]
                for _ in range(args.pad_depth):
                    pad = [pad]
                out["fake_pad"] = pad
            if not args.no_usage:
                out["usage"] = usage
            self.send_json(200, out, self.echo_extra())

        def stream_chat(self, model, reply, usage, include):
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Cache-Control", "no-cache")
            for k, v in self.echo_extra().items():
                self.send_header(k, v)
            self.end_headers()
            parts = [w + " " for w in reply.split(" ")]
            parts[-1] = parts[-1].rstrip(" ")

            def send(obj):
                self.wfile.write(b"data: " + json.dumps(obj).encode() + b"\n\n")
                self.wfile.flush()

            for i, p in enumerate(parts):
                chunk = {"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": 0,
                         "model": model,
                         "choices": [{"index": 0, "delta": {"content": p},
                                      "finish_reason": "stop" if i == len(parts) - 1 else None}]}
                if include:
                    chunk["usage"] = None
                send(chunk)
                if args.chunk_delay_ms:
                    time.sleep(args.chunk_delay_ms / 1000.0)
            if usage is not None:
                send({"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": 0,
                      "model": model, "choices": [], "usage": usage})
            self.wfile.write(b"data: [DONE]\n\n")
            self.wfile.flush()

        def embeddings(self, req):
            inputs = req.get("input")
            if isinstance(inputs, str) or not isinstance(inputs, list):
                inputs = [inputs]
            tokens = sum(words(i) for i in inputs)
            data = [{"object": "embedding", "index": i,
                     "embedding": [round(((i + 1) * (d + 1)) % 7 / 7.0, 4)
                                   for d in range(EMBEDDING_DIM)]}
                    for i in range(len(inputs))]
            out = {"object": "list", "data": data, "model": str(req.get("model", ""))}
            if not args.no_usage:
                out["usage"] = {"prompt_tokens": tokens, "total_tokens": tokens}
            self.send_json(200, out, self.echo_extra())

    return Handler


def main():
    p = argparse.ArgumentParser(description="OpenAI-compatible fake upstream (loopback only)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--port-file")
    p.add_argument("--require-key")
    p.add_argument("--echo-headers", action="store_true")
    p.add_argument("--no-usage", action="store_true")
    p.add_argument("--chunk-delay-ms", type=int, default=0)
    p.add_argument("--delay-ms", type=int, default=0)
    p.add_argument("--refuse-field")
    p.add_argument("--pad-bytes", type=int, default=0)
    p.add_argument("--pad-depth", type=int, default=0)
    p.add_argument("--max-requests", type=int, default=10000)
    p.add_argument("--max-seconds", type=float, default=600)
    args = p.parse_args()
    if args.host not in LOOPBACK:
        sys.exit("fake-openai: refusing to listen on %r: loopback (127.0.0.1) only" % args.host)
    if args.max_requests < 1 or args.max_seconds <= 0:
        sys.exit("fake-openai: --max-requests and --max-seconds must be positive")
    if not 0 <= args.delay_ms <= 60000 or not 0 <= args.chunk_delay_ms <= 60000:
        sys.exit("fake-openai: --delay-ms and --chunk-delay-ms must be 0 to 60000")
    if not 0 <= args.pad_bytes <= 64 << 20 or not 0 <= args.pad_depth <= 900:
        sys.exit("fake-openai: --pad-bytes must be 0 to 64 MiB and --pad-depth 0 to 900")

    state = State(args)
    server = ThreadingHTTPServer(("127.0.0.1", args.port), make_handler(state))
    server.daemon_threads = True
    port = server.server_address[1]
    if args.port_file:
        tmp = args.port_file + ".tmp"
        with open(tmp, "w") as f:
            f.write("%d\n" % port)
        os.replace(tmp, args.port_file)
    else:
        print(port, flush=True)

    t = threading.Thread(target=server.serve_forever, daemon=True)
    t.start()
    state.done.wait(timeout=args.max_seconds)
    server.shutdown()
    server.server_close()


if __name__ == "__main__":
    main()
