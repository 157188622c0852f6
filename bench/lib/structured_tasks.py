"""The task set of bench/engine/structured_quality.py and how its answers are judged: 15
json_object prompts and 15 prompts with a JSON Schema each (`tasks`), and `parses`, which reads an
answer as JSON (whole when constrained, else its first fenced ```json block or the whole text) and
validates it against its schema."""

from __future__ import annotations

import json
import re
from typing import Any

import jsonschema

S = {"type": "string", "maxLength": 40}
INT = {"type": "integer", "minimum": 0, "maximum": 10000}
OBJECT_PROMPTS = [
    "Give three fruits and their colours as JSON.",
    "Describe a cat as a JSON object.",
    "Return the weather in Paris today as JSON.",
    "List three programming languages and the year each appeared, as JSON.",
    "Give a JSON object describing a book you like.",
    "Make a JSON object with the capitals of France, Spain and Italy.",
    "Write a JSON object for a user profile with a name, an age and hobbies.",
    "Represent a shopping list of four items as a JSON object.",
    "Give the planets of the solar system and their order as JSON.",
    "Describe a car (brand, model, year, colour) in JSON.",
    "Return a JSON object with today's three top tasks and their priority.",
    "Make a JSON object describing a recipe for pancakes.",
    "Give the days of the week and whether each is a weekday, as JSON.",
    "Describe your favourite movie as a JSON object.",
    "Make a JSON object with three countries and their populations.",
]
SCHEMAS: list[tuple[str, dict[str, Any]]] = [
    (
        "Give a person as JSON.",
        {"type": "object", "properties": {"name": S, "age": INT}, "required": ["name", "age"]},
    ),
    (
        "Give a product with its price and whether it is in stock.",
        {
            "type": "object",
            "properties": {"name": S, "price": {"type": "number"}, "in_stock": {"type": "boolean"}},
            "required": ["name", "price", "in_stock"],
        },
    ),
    (
        "List up to five colours.",
        {
            "type": "object",
            "properties": {"colours": {"type": "array", "items": S, "maxItems": 5}},
            "required": ["colours"],
        },
    ),
    (
        "Give an address.",
        {
            "type": "object",
            "properties": {
                "street": S,
                "city": S,
                "zip": {"type": "string", "pattern": "^[0-9]{5}$"},
                "country": S,
            },
            "required": ["street", "city", "zip", "country"],
        },
    ),
    (
        "Which direction is the sun setting in?",
        {
            "type": "object",
            "properties": {"direction": {"enum": ["north", "south", "east", "west"]}},
            "required": ["direction"],
        },
    ),
    (
        "Give three people with their ages.",
        {
            "type": "object",
            "properties": {
                "people": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "properties": {"name": S, "age": INT},
                        "required": ["name", "age"],
                    },
                    "maxItems": 3,
                }
            },
            "required": ["people"],
        },
    ),
    (
        "Give a company with its address.",
        {
            "type": "object",
            "properties": {
                "company": S,
                "address": {
                    "type": "object",
                    "properties": {"city": S, "country": S},
                    "required": ["city", "country"],
                },
            },
            "required": ["company", "address"],
        },
    ),
    (
        "Rate this sentence's sentiment: 'I love sunny days.'",
        {
            "type": "object",
            "properties": {
                "sentiment": {"enum": ["positive", "negative", "neutral"]},
                "score": {"type": "number"},
            },
            "required": ["sentiment", "score"],
        },
    ),
    (
        "Give a date and an event.",
        {
            "type": "object",
            "properties": {"date": {"type": "string", "format": "date"}, "event": S},
            "required": ["date", "event"],
        },
    ),
    (
        "Give a to-do list with done flags.",
        {
            "type": "object",
            "properties": {
                "todos": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "properties": {"task": S, "done": {"type": "boolean"}},
                        "required": ["task", "done"],
                    },
                    "maxItems": 4,
                }
            },
            "required": ["todos"],
        },
    ),
    (
        "Give a temperature reading in celsius.",
        {
            "type": "object",
            "properties": {"celsius": {"type": "number", "minimum": -60, "maximum": 60}},
            "required": ["celsius"],
        },
    ),
    (
        "Give a movie with its genres.",
        {
            "type": "object",
            "properties": {"title": S, "genres": {"type": "array", "items": S, "maxItems": 3}, "year": INT},
            "required": ["title", "genres", "year"],
        },
    ),
    (
        "Give a user with an optional nickname.",
        {
            "type": "object",
            "properties": {"name": S, "nickname": {"type": ["string", "null"], "maxLength": 20}},
            "required": ["name", "nickname"],
        },
    ),
    (
        "Give coordinates of a city.",
        {
            "type": "object",
            "properties": {"city": S, "lat": {"type": "number"}, "lon": {"type": "number"}},
            "required": ["city", "lat", "lon"],
        },
    ),
    (
        "Give a list of three integers between 1 and 9.",
        {
            "type": "array",
            "items": {"type": "integer", "minimum": 1, "maximum": 9},
            "minItems": 3,
            "maxItems": 3,
        },
    ),
]


def tasks() -> list[tuple[str, dict[str, Any] | None]]:
    return [(p, None) for p in OBJECT_PROMPTS] + [(p + " Answer in JSON.", s) for p, s in SCHEMAS]


FENCE = re.compile(r"```(?:json)?\s*\n(.*?)```", re.S)


def parses(text: str, schema: dict[str, Any] | None, constrained: bool) -> bool:
    """The answer as JSON: whole (constrained), else its first fenced block or the whole text."""
    candidates = [text] if constrained else [m.group(1) for m in FENCE.finditer(text)][:1] or [text]
    try:
        doc = json.loads(candidates[0])
    except ValueError:
        return False
    if schema is None:
        return isinstance(doc, dict)
    try:
        jsonschema.validate(doc, schema, format_checker=jsonschema.FormatChecker())
    except jsonschema.ValidationError:
        return False
    return True
