// Checks a ledger receipt in the browser: each entry's hashes recomputed from its fields, its RFC 9162
// inclusion proof against the checkpoint root, and the checkpoint's Ed25519 signature (C2SP signed note).
// The same checks as ledger/audit/, so a buyer need not take the server's word for "verified".
"use strict";

(async function () {
  const receipt = JSON.parse(document.getElementById("receipt-data").textContent);
  const verdict = document.getElementById("verdict");
  const enc = new TextEncoder();

  const sha256 = async (bytes) => new Uint8Array(await crypto.subtle.digest("SHA-256", bytes));
  const hex = (bytes) => Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");
  const fromHex = (text) => new Uint8Array(text.match(/../g).map((h) => parseInt(h, 16)));
  const fromB64 = (text) => Uint8Array.from(atob(text), (c) => c.charCodeAt(0));
  const concat = (...parts) => {
    const out = new Uint8Array(parts.reduce((n, p) => n + p.length, 0));
    let at = 0;
    for (const p of parts) { out.set(p, at); at += p.length; }
    return out;
  };
  const equal = (a, b) => a.length === b.length && a.every((x, i) => x === b[i]);
  const leafHash = async (data) => sha256(concat(new Uint8Array([0]), data));
  const nodeHash = async (l, r) => sha256(concat(new Uint8Array([1]), l, r));

  // The envelope is canonical JSON: keys sorted, no spaces (ledger/canonical.py).
  const envelope = (e) => JSON.stringify({
    created_at: e.created_at, kind: e.kind, payload_sha256: e.payload_hash,
    prev: e.prev_hash, sequence: e.sequence, subject: e.subject,
  });

  // RFC 9162 section 2.1.3.2.
  async function verifyInclusion(leaf, index, size, proof, root) {
    if (index >= size) return false;
    let fn = index, sn = size - 1, r = leaf;
    for (const p of proof) {
      if (sn === 0) return false;
      if (fn % 2 === 1 || fn === sn) {
        r = await nodeHash(p, r);
        while (fn !== 0 && fn % 2 === 0) { fn = Math.floor(fn / 2); sn = Math.floor(sn / 2); }
      } else {
        r = await nodeHash(r, p);
      }
      fn = Math.floor(fn / 2); sn = Math.floor(sn / 2);
    }
    return sn === 0 && equal(r, root);
  }

  async function checkSignature(checkpoint) {
    // name+keyid+base64: the base64 may itself contain "+", so cut at the first two only.
    const vkey = receipt.verifier_key;
    const first = vkey.indexOf("+"), second = vkey.indexOf("+", first + 1);
    const name = vkey.slice(0, first), keyB64 = vkey.slice(second + 1);
    const raw = fromB64(keyB64);
    const cut = checkpoint.note.indexOf("\n\n");
    const text = checkpoint.note.slice(0, cut + 1);
    const [origin, size, rootB64] = text.split("\n");
    if (Number(size) !== checkpoint.size || hex(fromB64(rootB64)) !== checkpoint.root || origin !== receipt.origin) {
      return [false, "the signed note states another tree than the checkpoint"];
    }
    const line = checkpoint.note.slice(cut + 2).split("\n").find((l) => l.startsWith("\u2014 " + name + " "));
    if (!line) return [false, "no signature by " + name];
    const stamp = fromB64(line.split(" ")[2]);
    try {
      const key = await crypto.subtle.importKey("raw", raw.slice(1), { name: "Ed25519" }, false, ["verify"]);
      const ok = await crypto.subtle.verify("Ed25519", key, stamp.slice(4), enc.encode(text));
      return [ok, ok ? "valid Ed25519 signature by " + name : "the signature does not verify"];
    } catch (err) {
      return [null, "this browser cannot check Ed25519 signatures; use python -m ledger.audit"];
    }
  }

  const checkpoint = receipt.checkpoint;
  const pending = (receipt.pending || []).length + (receipt.queued || []).length;
  // Pending is not a failure: the broker signs a checkpoint for them now; look again in a few seconds.
  const pendingNote = pending ? ` ${pending} ${checkpoint ? "newer " : ""}entr${pending === 1 ? "y waits" : "ies wait"} for the next signed checkpoint, which the broker is signing now; this page checks again in a few seconds.` : "";
  if (pending) setTimeout(() => window.location.reload(), 5000);
  if (!checkpoint) {
    verdict.textContent = pending ? "Pending:" + pendingNote : "Nothing to check yet: no checkpoint covers these entries.";
    return;
  }
  const root = fromHex(checkpoint.root);
  let failures = 0;
  for (const entry of receipt.entries) {
    const cell = document.querySelector(`tr[data-sequence="${entry.sequence}"] .proof-check`);
    const payloadOk = hex(await sha256(enc.encode(entry.payload))) === entry.payload_hash;
    const leaf = await leafHash(enc.encode(envelope(entry)));
    const leafOk = hex(leaf) === entry.leaf_hash;
    const proof = (entry.inclusion_proof || []).map(fromHex);
    const included = leafOk && entry.inclusion_proof !== null
      && await verifyInclusion(leaf, entry.sequence - 1, checkpoint.size, proof, root);
    const ok = payloadOk && included;
    failures += ok ? 0 : 1;
    cell.className = "proof-check nowrap " + (ok ? "check-ok" : "check-bad");
    cell.textContent = ok ? `\u2713 in checkpoint (${proof.length} hash${proof.length === 1 ? "" : "es"})`
      : !payloadOk ? "\u2717 payload altered" : !leafOk ? "\u2717 entry fields altered"
      : entry.inclusion_proof === null ? "\u2717 no proof given" : "\u2717 proof fails";
  }
  const [signed, message] = await checkSignature(checkpoint);
  const signatureCell = document.getElementById("signature-check");
  signatureCell.textContent = message;
  signatureCell.className = signed === null ? "muted" : signed ? "check-ok" : "check-bad";
  if (failures === 0 && signed !== false) {
    verdict.className = pending ? "verdict pending" : "verdict ok";
    verdict.textContent = `\u2713 Verified in this page: ${receipt.entries.length} entries are in the signed checkpoint of ${checkpoint.size}.` + pendingNote;
  } else {
    verdict.className = "verdict bad";
    const problems = [];
    if (failures) problems.push(`${failures} entr${failures === 1 ? "y does" : "ies do"} not match the signed checkpoint`);
    if (signed === false) problems.push("the checkpoint's signature does not verify");
    verdict.textContent = "\u2717 Verification failed: " + problems.join("; ") + ".";
  }
})();
