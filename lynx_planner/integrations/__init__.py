"""Hooks that apply a lynx plan inside other training stacks (torchtitan); each imports its stack on use."""
