# Copyright (c) 2026 fla_bwd authors. SPDX-License-Identifier: MIT
