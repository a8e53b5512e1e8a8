"""What several test modules share. Test modules import from here, never from each other or
from `conftest` (tests/test_hermetic.py checks), so each one still reads on its own."""
