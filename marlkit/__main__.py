from marlkit.cli import main

raise SystemExit(main())
