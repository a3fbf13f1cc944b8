#!/usr/bin/env bash
# case.sh TRIDENT DIR: runs one fuzz case (a folder written by gen.py) and
# prints one line: "ok NAME rc" or "FAIL NAME why". A failure is a sanitizer
# report, a signal, a timeout, an exit other than 0 or 2, or exit 0 for a case
# whose expect file says corrupt. Output stays in DIR/out.txt and DIR/err.txt.
set -u
T=$1 d=$2
name=$(basename "$d")
cd "$d" || { echo "FAIL $name no folder"; exit 0; }
kind=$(cat cmd) expect=$(cat expect)
over=(); [ -f overrides ] && mapfile -t over < overrides
in=/dev/null
case $kind in
    verify) cmd=("$T" ckpt verify ck/step-000001) ;;
    data)   cmd=("$T" data-check ds --seq-len 16) ;;
    tok)    cmd=("$T" tokenize --tokenizer tokenizer.json); in=stdin.txt ;;
    decode) cmd=("$T" tokenize --tokenizer tokenizer.json --decode); in=stdin.txt ;;
    prep)   cmd=("$T" prep --input in --output out --tokenizer tokenizer.json --val-fraction 0 --quiet) ;;
    plan)   cmd=("$T" plan fuzz.ini "${over[@]}") ;;
    train)  cmd=("$T" train fuzz.ini "${over[@]}") ;;
    *)      echo "FAIL $name unknown kind $kind"; exit 0 ;;
esac
timeout -k 5 "${FUZZ_TIMEOUT:-30}" "${cmd[@]}" <"$in" >out.txt 2>err.txt
rc=$?
why=
if grep -q -E 'ERROR: AddressSanitizer|runtime error:|ERROR: LeakSanitizer|SUMMARY: (Address|UndefinedBehavior)Sanitizer' err.txt; then
    why="sanitizer: $(grep -m1 -E 'ERROR: AddressSanitizer|runtime error:' err.txt)"
elif [ $rc -eq 124 ] || [ $rc -eq 137 ]; then why="timeout (${FUZZ_TIMEOUT:-30} s)"
elif [ $rc -gt 128 ]; then why="signal $((rc - 128))"
elif [ $rc -ne 0 ] && [ $rc -ne 2 ]; then why="exit $rc: $(tail -n1 err.txt)"
elif [ $rc -eq 0 ] && [ "$expect" = corrupt ]; then why="exit 0 for a corrupt input"
fi
if [ -n "$why" ]; then echo "FAIL $name $kind $why"; else echo "ok $name $kind $rc"; fi
