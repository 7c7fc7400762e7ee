from ablate.docs import main

main()
