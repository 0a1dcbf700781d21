"""The pydantic form of schema.json: `--schema examples/sample_data/person.py:Person`."""

from pydantic import BaseModel, ConfigDict, Field


class Person(BaseModel):
    model_config = ConfigDict(extra="forbid")  # additionalProperties: false

    name: str = Field(min_length=1, max_length=40)
    age: int = Field(ge=0, le=120)
    city: str = Field(min_length=1, max_length=30)
