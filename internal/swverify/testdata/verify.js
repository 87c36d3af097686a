// Verifies request dumps with the reference Standard Webhooks library
// (npm standardwebhooks), independently of shaper's Go code.
//
// Input (stdin): JSON {"secrets": ["whsec_..."], "requests": [{"headers":
// {name: value}, "body": "<the body as sent>"}]}.
// Output (stdout): JSON {"results": [[null | "<error>", ... one per secret]
// ... one per request]}: null where new Webhook(secret).verify(body, headers)
// accepted the request (and returned the body parsed as JSON), else the
// verifier's error message.
"use strict";
const { Webhook } = require("standardwebhooks");

let input = "";
process.stdin.setEncoding("utf8");
process.stdin.on("data", (chunk) => { input += chunk; });
process.stdin.on("end", () => {
  const { secrets, requests } = JSON.parse(input);
  const hooks = secrets.map((s) => new Webhook(s));
  const results = requests.map((req) => hooks.map((wh) => {
    try {
      const parsed = wh.verify(req.body, req.headers);
      const sent = req.body === "" ? undefined : JSON.parse(req.body);
      if (JSON.stringify(parsed) !== JSON.stringify(sent)) {
        return "verified, but returned another payload";
      }
      return null;
    } catch (e) {
      return String(e && e.message ? e.message : e);
    }
  }));
  process.stdout.write(JSON.stringify({ results }));
});
