"""Code-completion cases with expected answers, for ``scripts/compare_fim_layouts.py`` (issue 52, item 4).

Each case is a small source file in one language with the cursor (``█``) in the middle of a line that is being
typed, and the accepted completions of that line: the text that belongs between the cursor and the line's end (or
the text already after the cursor on that line, e.g. a bracket an editor closed by itself). A completion passes
when its first line, trailing white space dropped, is one of ``accept`` (or matches ``pattern``, a regular
expression that must match the whole line), either alone or followed by the text already after the cursor (what
llama.vscode strips from a suggestion that ends with it). A trailing comment the model adds is not part of the
code and is dropped first (``read()  # the body`` passes for ``read()``). Leading white space counts:
``return  x`` is a wrong insertion. The files were written for this benchmark (no third-party code).
"""
from __future__ import annotations

import re
from dataclasses import dataclass

CURSOR = "█"
COMMENT = {"python": r"\s+#", "bash": r"\s+#", "sql": r"\s+--"}
"""Where a trailing comment starts, by language (``//`` for the others)."""


@dataclass(frozen=True)
class FimCase:
    """One completion case: ``source`` holds exactly one :data:`CURSOR`; ``accept`` the right texts from the
    cursor to the end of the line; ``pattern`` an optional regular expression for the same (full match)."""

    name: str
    language: str
    source: str
    accept: tuple[str, ...] = ()
    pattern: str | None = None

    def __post_init__(self) -> None:
        assert self.source.count(CURSOR) == 1, self.name
        assert self.accept or self.pattern, self.name

    @property
    def before(self) -> str:
        """The file's text before the cursor (ends in the middle of the current line)."""
        return self.source.split(CURSOR)[0]

    @property
    def after(self) -> str:
        """The file's text after the cursor (the rest of the current line first)."""
        return self.source.split(CURSOR)[1]

    @property
    def line_rest(self) -> str:
        """What already follows the cursor on its line (often empty)."""
        return self.after.split("\n", 1)[0]

    def passes(self, completion: str) -> bool:
        """Whether ``completion``'s first line completes the cursor's line correctly (see the module docstring)."""
        first = completion.split("\n", 1)[0].rstrip()
        first = re.split(COMMENT.get(self.language, r"\s+//"), first, maxsplit=1)[0].rstrip()
        rest = self.line_rest.rstrip()
        candidates = [first]
        if rest and first.endswith(rest):
            candidates.append(first[: len(first) - len(rest)])
        for c in candidates:
            if c in self.accept or (self.pattern is not None and re.fullmatch(self.pattern, c)):
                return True
        return False


C = FimCase
CASES: tuple[FimCase, ...] = (
    # ---- Python ---------------------------------------------------------------------------------------------
    C("py-circle-area", "python", '''import math


def circle_area(radius: float) -> float:
    """Return the area of a circle with the given radius."""
    return █


def circle_circumference(radius: float) -> float:
    """Return the circumference of a circle with the given radius."""
    return 2 * math.pi * radius
''', ("math.pi * radius ** 2", "math.pi * radius**2", "math.pi * radius * radius", "math.pi * (radius ** 2)",
      "math.pi * pow(radius, 2)")),
    C("py-stack-push", "python", '''class Stack:
    """A last-in, first-out stack."""

    def __init__(self):
        self._items = []

    def push(self, item):
        """Put item on top of the stack."""
        self._items.█

    def pop(self):
        """Remove and return the top item; IndexError when empty."""
        return self._items.pop()

    def __len__(self):
        return len(self._items)
''', ("append(item)",)),
    C("py-load-json", "python", '''import json
from pathlib import Path


def load_config(path: Path) -> dict:
    """Read a JSON configuration file and return it as a dict."""
    with open(path, encoding="utf-8") as f:
        return █


def save_config(path: Path, config: dict) -> None:
    """Write config to path as indented JSON."""
    with open(path, "w", encoding="utf-8") as f:
        json.dump(config, f, indent=2)
''', ("json.load(f)",)),
    C("py-fibonacci", "python", '''def fibonacci(n: int) -> int:
    """The n-th Fibonacci number (fibonacci(0) == 0, fibonacci(1) == 1)."""
    a, b = 0, 1
    for _ in range(n):
        a, b = b, █
    return a


def test_fibonacci():
    assert [fibonacci(i) for i in range(8)] == [0, 1, 1, 2, 3, 5, 8, 13]
''', ("a + b", "b + a")),
    C("py-argparse-type", "python", '''import argparse


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description="Resize the images in a folder.")
    parser.add_argument("folder", help="folder with the images")
    parser.add_argument("--width", type=int, default=800, help="target width in pixels")
    parser.add_argument("--height", type=█, default=600, help="target height in pixels")
    parser.add_argument("--quality", type=int, default=85, help="JPEG quality, 1-95")
    return parser.parse_args(argv)
''', ("int",)),
    C("py-word-counts", "python", '''from collections import Counter


def word_counts(text: str) -> Counter:
    """Count how often each lower-cased, white-space separated word occurs in text."""
    words = text.lower().█
    return Counter(words)
''', ("split()",)),
    C("py-even-squares", "python", '''def squares_of_evens(numbers):
    """The squares of the even numbers, in order."""
    return [n * n for n in numbers if █]


assert squares_of_evens([1, 2, 3, 4]) == [4, 16]
''', ("n % 2 == 0", "not n % 2")),
    C("py-rectangle-area", "python", '''from dataclasses import dataclass


@dataclass
class Rectangle:
    width: float
    height: float

    @property
    def area(self) -> float:
        return self.width * █

    @property
    def perimeter(self) -> float:
        return 2 * (self.width + self.height)
''', ("self.height",)),
    C("py-safe-divide", "python", '''def safe_divide(a: float, b: float) -> float | None:
    """a / b, or None when b is zero."""
    try:
        return a / b
    except █
        return None
''', ("ZeroDivisionError:",)),
    C("py-main-guard", "python", '''import sys


def main() -> int:
    print("hello")
    return 0


if __name__ == █
''', ('"__main__":', "'__main__':")),
    C("py-sort-by-age", "python", '''users = [
    {"name": "Ada", "age": 36},
    {"name": "Linus", "age": 28},
    {"name": "Grace", "age": 45},
]

# youngest first
by_age = sorted(users, key=█)
for user in by_age:
    print(user["name"], user["age"])
''', (), r"""lambda (\w+): \1\[["']age["']\]|operator\.itemgetter\(["']age["']\)|itemgetter\(["']age["']\)"""),
    C("py-walk-join", "python", '''import os


def find_python_files(root):
    """Yield the paths of all .py files under root."""
    for dirpath, dirnames, filenames in os.walk(root):
        for name in filenames:
            if name.endswith(".py"):
                yield os.path.█
''', ("join(dirpath, name)",)),
    C("py-price-format", "python", '''def greet(name: str, times: int) -> str:
    return f"Hello, {name}! " * times


def describe(product: str, price: float) -> str:
    """A one-line description, the price with two decimals."""
    return f"{product} costs {price:█
''', ('.2f}"',)),
    C("py-urlopen-read", "python", '''import urllib.request


def fetch(url: str) -> bytes:
    """The body of url; RuntimeError unless the answer is 200."""
    with urllib.request.urlopen(url, timeout=10) as response:
        if response.status != 200:
            raise RuntimeError(f"GET {url} failed with status {response.status}")
        return response.█
''', ("read()",)),
    C("py-logger", "python", '''"""Synchronise a folder with a remote bucket."""
import logging
import os

log = logging.getLogger(█


def sync(folder: str) -> None:
    for name in os.listdir(folder):
        log.info("uploading %s", name)
''', ("__name__)",)),
    C("py-write-lines", "python", '''def write_lines(path, lines):
    """Write each string of lines to path, one per line."""
    with open(path, "w", encoding="utf-8") as f:
        for line in lines:
            f.write(█
''', ('line + "\\n")', "line + '\\n')", 'f"{line}\\n")', "f'{line}\\n')")),
    C("py-vector-add", "python", '''class Vector:
    def __init__(self, x, y):
        self.x = x
        self.y = y

    def __add__(self, other):
        return Vector(self.x + other.x, █

    def __repr__(self):
        return f"Vector({self.x}, {self.y})"
''', ("self.y + other.y)",)),
    # ---- JavaScript / TypeScript ----------------------------------------------------------------------------
    C("js-reduce-sum", "javascript", '''export function sum(numbers) {
  return numbers.reduce((total, n) => █, 0);
}

export function average(numbers) {
  return numbers.length ? sum(numbers) / numbers.length : 0;
}
''', ("total + n",)),
    C("js-fetch-json", "javascript", '''async function getUser(id) {
  const response = await fetch(`/api/users/${id}`);
  if (!response.ok) {
    throw new Error(`HTTP ${response.status}`);
  }
  return await response.█
}
''', ("json();", "json()")),
    C("js-click-listener", "javascript", '''const button = document.getElementById("save");
const status = document.getElementById("status");

button.addEventListener("█
  status.textContent = "Saved";
});
''', (), r"""click", (\(\) =>|\(event\) =>|\(e\) =>|event =>|e =>|function ?\(\w*\)) \{"""),
    C("ts-distance", "typescript", '''interface Point {
  x: number;
  y: number;
}

export function distance(a: Point, b: Point): number {
  const dx = a.x - b.x;
  const dy = a.y - b.y;
  return Math.█
}
''', ("sqrt(dx * dx + dy * dy);", "hypot(dx, dy);", "sqrt(dx ** 2 + dy ** 2);", "sqrt(dx*dx + dy*dy);",
      "sqrt(Math.pow(dx, 2) + Math.pow(dy, 2));")),
    C("ts-open-todos", "typescript", '''type Todo = { id: number; title: string; done: boolean };

export function openTodos(todos: Todo[]): Todo[] {
  return todos.filter((todo) => █);
}

export function doneTodos(todos: Todo[]): Todo[] {
  return todos.filter((todo) => todo.done);
}
''', ("!todo.done", "todo.done === false")),
    C("js-counter-constructor", "javascript", '''export class Counter {
  constructor(start = 0) {
    this.count = █
  }

  increment() {
    this.count += 1;
    return this.count;
  }
}
''', ("start;",)),
    C("js-full-names", "javascript", '''const people = [
  { first: "Ada", last: "Lovelace" },
  { first: "Alan", last: "Turing" },
];

const fullNames = people.map((p) => `${p.first} █
console.log(fullNames.join(", "));
''', ("${p.last}`);",)),
    C("ts-sleep", "typescript", '''export function sleep(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(█
}

export async function retry<T>(fn: () => Promise<T>, times: number): Promise<T> {
  for (let i = 0; ; i++) {
    try {
      return await fn();
    } catch (e) {
      if (i + 1 >= times) throw e;
      await sleep(100 * 2 ** i);
    }
  }
}
''', ("resolve, ms));",)),
    # ---- Go -------------------------------------------------------------------------------------------------
    C("go-unmarshal", "go", '''package config

import (
	"encoding/json"
	"os"
)

type Config struct {
	Addr    string `json:"addr"`
	Verbose bool   `json:"verbose"`
}

func Load(path string) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var c Config
	if err := json.Unmarshal(█
		return nil, err
	}
	return &c, nil
}
''', ("data, &c); err != nil {",)),
    C("go-mean", "go", '''package stats

// Mean returns the arithmetic mean of xs, or 0 for an empty slice.
func Mean(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	var sum float64
	for _, x := range xs {
		sum += x
	}
	return sum / █
}
''', ("float64(len(xs))",)),
    C("go-listen", "go", '''package main

import (
	"fmt"
	"log"
	"net/http"
)

func hello(w http.ResponseWriter, r *http.Request) {
	fmt.Fprintf(w, "hello, %s\\n", r.URL.Path[1:])
}

func main() {
	http.HandleFunc("/", hello)
	log.Fatal(http.ListenAndServe(█
}
''', (), r'"[\w.]*:\d+", nil\)\)'),
    C("go-rect-area", "go", '''package shapes

type Rect struct {
	W, H float64
}

// Area returns the rectangle's area.
func (r Rect) Area() float64 {
	return █
}

// Perimeter returns the length of the rectangle's border.
func (r Rect) Perimeter() float64 {
	return 2 * (r.W + r.H)
}
''', ("r.W * r.H",)),
    C("go-evens-append", "go", '''package filter

// Evens returns the even numbers of xs, in order.
func Evens(xs []int) []int {
	var out []int
	for _, x := range xs {
		if x%2 == 0 {
			out = █
		}
	}
	return out
}
''', ("append(out, x)",)),
    C("go-csv-join", "go", '''package csvline

import "strings"

// CSVLine joins fields with commas.
func CSVLine(fields []string) string {
	return strings.█
}
''', ('Join(fields, ",")',)),
    # ---- C --------------------------------------------------------------------------------------------------
    C("c-strlen", "c", '''#include <stddef.h>

/* Length of a NUL-terminated string, like strlen. */
size_t my_strlen(const char *s)
{
    size_t n = 0;
    while (s[n] != █
        n++;
    return n;
}
''', ("'\\0')", "0)")),
    C("c-strdup-malloc", "c", '''#include <stdlib.h>
#include <string.h>

/* A copy of s in newly allocated memory, or NULL when out of memory. */
char *my_strdup(const char *s)
{
    size_t len = strlen(s) + 1;
    char *copy = malloc(█
    if (copy == NULL)
        return NULL;
    memcpy(copy, s, len);
    return copy;
}
''', ("len);",)),
    C("c-swap", "c", '''/* Swap the ints a and b point to. */
void swap(int *a, int *b)
{
    int tmp = *a;
    *a = █
    *b = tmp;
}
''', ("*b;",)),
    C("c-max-loop", "c", '''/* Largest of the n > 0 values in a. */
int max_of(const int *a, int n)
{
    int best = a[0];
    for (int i = 1; i < █
        if (a[i] > best)
            best = a[i];
    return best;
}
''', ("n; i++)", "n; ++i)")),
    # ---- Rust -----------------------------------------------------------------------------------------------
    C("rust-first-word", "rust", '''/// The first word of `s`, or the empty string.
pub fn first_word(s: &str) -> &str {
    match s.split_whitespace().next() {
        Some(w) => w,
        None => █
    }
}
''', ('"",',)),
    C("rust-display-point", "rust", '''use std::fmt;

pub struct Point {
    pub x: i32,
    pub y: i32,
}

impl fmt::Display for Point {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "({}, {})", █
    }
}
''', ("self.x, self.y)",)),
    C("rust-sum-squares", "rust", '''/// Sum of the squares of `xs`.
pub fn sum_of_squares(xs: &[i64]) -> i64 {
    xs.iter().map(|x| █).sum()
}
''', ("x * x", "x.pow(2)")),
    # ---- shell, SQL -----------------------------------------------------------------------------------------
    C("sh-wav-to-mp3", "bash", '''#!/usr/bin/env bash
# Convert every .wav file in the current folder to .mp3.
set -euo pipefail
for f in *.wav; do
  ffmpeg -i "$f" "${f%.wav}.█
done
''', ('mp3"',)),
    C("sql-join-on", "sql", '''-- Customers who placed at least one order in 2024, with their order count.
SELECT c.id, c.name, COUNT(o.id) AS orders
FROM customers c
JOIN orders o ON █
WHERE o.created_at >= '2024-01-01' AND o.created_at < '2025-01-01'
GROUP BY c.id, c.name;
''', ("o.customer_id = c.id", "c.id = o.customer_id")),
)

assert len({c.name for c in CASES}) == len(CASES)
