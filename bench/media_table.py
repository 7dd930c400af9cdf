#!/usr/bin/env python3
"""The table of scripts/gpu/media_bench.sh: reads its $OUT files, prints what / anna / reference /
ratio (ratio > 1: anna faster or more). Missing pieces print as "-" with the reason in a note.

    python3 bench/media_table.py OUT [--device cuda] [--tiny] [--vision-text-layers N]
"""
import argparse
import json
import os
import re


def last_json(path):
    """The file as one JSON document (anna-bench --json), else its last line that is one."""
    try:
        return json.load(open(path))
    except (OSError, ValueError):
        pass
    try:
        lines = [ln for ln in open(path) if ln.startswith("{")]
        return json.loads(lines[-1]) if lines else None
    except (OSError, ValueError):
        return None


def read(path):
    try:
        return open(path).read()
    except OSError:
        return ""


def fmt(v, nd=1):
    if v is None:
        return "-"
    if isinstance(v, str):
        return v
    return f"{v:,.{nd}f}"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--vision-text-layers", type=int, default=4)
    ap.add_argument("--clip-seconds", type=float, default=8.0)
    a = ap.parse_args()
    o = a.out
    clip_s = a.clip_seconds
    rows, notes = [], []

    def row(what, anna, ref, higher_better, nd=1):
        ratio = None
        if isinstance(anna, (int, float)) and isinstance(ref, (int, float)) and anna and ref:
            ratio = anna / ref if higher_better else ref / anna
        rows.append((what, fmt(anna, nd), fmt(ref, nd), fmt(ratio, 2) + ("x" if ratio else "")))

    # ---- vision
    vref = last_json(os.path.join(o, "vision_ref.json"))
    if vref and "skip" in vref:
        notes.append("vision reference: " + vref["skip"])
        vref = None
    elif vref:
        notes.append(f"vision reference: transformers {vref.get('transformers')} torch {vref.get('torch')} "
                     f"{vref.get('dtype')} sdpa, fla {vref.get('fla')}; {vref.get('processor')}")
    for n in (448, 1024):
        an = last_json(os.path.join(o, f"vision_anna_{n}.json"))
        rf = next((r for r in (vref or {}).get("images", []) if r["size"][0] == n), None)
        tok = (an or {}).get("image_tokens") or (rf or {}).get("visual_tokens")
        row(f"vision tower {n}x{n} ({tok} tok), ms", an and an.get("tower_ms"), rf and rf["tower_ms"], False)
        row(f"vision image+text TTFT {n}x{n}, ms", an and an.get("median", {}).get("ttft_ms"), rf and rf["ttft_ms"],
            False)
        if not an and os.path.exists(os.path.join(o, f"vision_anna_{n}.log")):
            notes.append(f"vision anna {n}: {read(os.path.join(o, f'vision_anna_{n}.log')).strip()[-200:]}")

    # ---- ASR
    def ms(n):
        try:
            v, rc = read(os.path.join(o, f"asr_transcribe_{n}.ms")).split()
            return int(v) / 1e3 if rc == "0" else None
        except ValueError:
            return None
    t1, t11 = ms(1), ms(11)
    asr_single = clip_s / ((t11 - t1) / 10) if t1 and t11 and t11 > t1 else None
    if (t1 is None or t11 is None) and os.path.exists(os.path.join(o, "asr_transcribe_1.txt")):
        notes.append("anna-transcribe: " + read(os.path.join(o, "asr_transcribe_1.txt")).strip()[-200:])
    conc = {}
    for ln in read(os.path.join(o, "asr_concurrency.txt")).splitlines():
        f = ln.split()
        if len(f) == 8 and f[0].isdigit():
            conc[int(f[0])] = dict(audio_s_per_s=float(f[4]), lat_ms=float(f[5]), tok_step=float(f[7]))
    aref = last_json(os.path.join(o, "asr_ref.json"))
    idl = [ln.strip() for ln in read(os.path.join(o, "asr_transcribe_1.txt")).splitlines()
           if re.fullmatch(r"\d+(,\d+)*", ln.strip())]  # --print-ids' line (stderr is in the file too)
    anna_ids = [int(x) for x in idl[0].split(",")] if idl else None
    rb = {b["batch"]: b for b in (aref or {}).get("batches", []) if "wall_s" in b}
    if aref:
        notes.append(f"asr reference: qwen-asr + transformers {aref.get('transformers')} {aref.get('dtype')} sdpa, "
                     f"generate of {aref.get('max_new')} new tokens, batches {sorted(rb)}")
    ref_ids = rb.get(1, {}).get("ids")
    if anna_ids and ref_ids:
        k = next((i for i, (x, y) in enumerate(zip(anna_ids, ref_ids)) if x != y), None)
        notes.append("asr greedy ids anna vs reference (batch 1): " +
                     (f"equal ({len(ref_ids)})" if k is None and len(anna_ids) == len(ref_ids)
                      else f"differ from token {k} (random weights: near-ties can flip; bf16 reference)"))
    row("asr 1 stream, x real time (anna-transcribe)", asr_single, rb.get(1, {}).get("rtf_x"), True)
    row("asr 1 stream, x real time (anna-serve c1)", conc.get(1, {}).get("audio_s_per_s"),
        rb.get(1, {}).get("rtf_x"), True)
    for c in (32, 128):
        row(f"asr concurrency {c}, audio-s/s", conc.get(c, {}).get("audio_s_per_s"),
            rb.get(c, {}).get("audio_s_per_s"), True)
    if conc:
        notes.append("asr anna-serve tokens/step at c32/c128: "
                     + "/".join(fmt(conc.get(c, {}).get("tok_step"), 2) for c in (32, 128)))

    # ---- TTS
    sp = read(os.path.join(o, "tts_speak.txt"))
    m = re.search(r"(\d+) frames, ([\d.]+) s of audio: first chunk ([\d.]+) s.*\(RTF ([\d.]+)\)", sp)
    tc = {r["n"]: r for r in (json.load(open(os.path.join(o, "tts_concurrency.json")))
                              if os.path.exists(os.path.join(o, "tts_concurrency.json")) else []) if "reqs" in r}
    tref = last_json(os.path.join(o, "tts_ref.json"))
    tb = {b["batch"]: b for b in (tref or {}).get("batches", []) if "wall_s" in b}
    if tref:
        notes.append(f"tts reference: qwen-tts + transformers {tref.get('transformers')} {tref.get('dtype')}, "
                     f"{tref.get('max_frames')} frames max, no streaming (first audio = whole utterance)")
    gl = [ln.strip() for ln in read(os.path.join(o, "tts_greedy_codes.txt")).splitlines()
          if re.fullmatch(r"\d+(,\d+){15}", ln.strip())]
    rg = (tref or {}).get("greedy_codes")
    if gl and rg:
        ag = [[int(x) for x in ln.split(",")] for ln in gl]
        k = next((i for i, (x, y) in enumerate(zip(ag, rg)) if x != y), None)
        notes.append("tts greedy codes anna vs reference: " +
                     (f"equal ({len(rg)} frames)" if k is None else f"differ from frame {k} (bf16 reference: near-ties)"))
    row("tts first audio, 1 stream, ms (anna-serve c1 p50)", tc.get(1, {}).get("first_ms_p50"),
        tb.get(1, {}).get("first_audio_ms"), False)
    row("tts first audio, anna-speak cold process, ms", float(m.group(3)) * 1e3 if m else None, None, False)
    row("tts 1 stream, x real time (anna-serve c1)", tc.get(1, {}).get("rtf_x_mean"),
        tb.get(1, {}).get("rtf_x_per_stream"), True, 2)
    row("tts 1 stream, x real time (anna-speak, cold)", float(m.group(4)) if m else None,
        tb.get(1, {}).get("rtf_x_per_stream"), True, 2)
    if not m and sp:
        notes.append("anna-speak: " + sp.strip()[-200:])
    for c in (16, 64):
        r = tc.get(c)
        rr = tb.get(c)
        row(f"tts concurrency {c}: real-time streams", r and f"{r['realtime_streams']}/{r['reqs']}",
            rr and f"{rr['realtime_streams']}/{c}", True)
        row(f"tts concurrency {c}: first audio p90, ms", r and r["first_ms_p90"], rr and rr["first_audio_ms"], False)

    w = max(len(r[0]) for r in rows)
    shapes = "tiny (shrunk)" if a.tiny else f"real (vision text: 9B width, {a.vision_text_layers} layers)"
    print(f"media benchmarks: device {a.device}, shapes {shapes}; ratio > 1 = anna ahead")
    print(f"{'what':{w}s}  {'anna':>12s}  {'reference':>12s}  {'ratio':>8s}")
    for r in rows:
        print(f"{r[0]:{w}s}  {r[1]:>12s}  {r[2]:>12s}  {r[3]:>8s}")
    for n in notes:
        print("note: " + n.replace("\n", " "))


if __name__ == "__main__":
    main()
