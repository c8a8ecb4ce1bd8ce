# SPDX-License-Identifier: Apache-2.0
"""Drop-in replacements that keep a peer library's exact signature."""
